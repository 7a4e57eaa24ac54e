import pytest

from qproxy_tools import path_routing

APPS = """
host     apps.example.com
gateway  gateway-system/public
app      search default /search
app      search-v2 default /search/v2   # longer, so tried first
app      login  auth /login
"""


def test_the_file_read():
    settings, apps = path_routing.parse(APPS, "apps.conf")
    assert settings["gateway"] == ("gateway-system", "public", None)
    assert settings["ingress"] == ("istio-system", "knative-local-gateway", 80)
    assert [a["prefix"] for a in apps] == ["/search", "/search/v2", "/login"]


@pytest.mark.parametrize(
    "line, error",
    [
        ("app search default search", "must start with '/'"),
        ("app search default /search/", "must start with '/'"),
        ("app other default /search", "already routed to search"),
        ("app search default /other", "listed twice"),
        ("colour blue", "unknown setting"),
        ("app Search default /s", "not a DNS label"),
    ],
)
def test_a_bad_line_is_named(line, error):
    with pytest.raises(path_routing.ConfError, match=error):
        path_routing.parse("host a.example.com\ngateway g/g\napp search default /search\n" + line, "apps.conf")


def test_missing_settings_are_named():
    with pytest.raises(path_routing.ConfError, match="no gateway line"):
        path_routing.parse("host a.example.com\napp a b /a\n", "apps.conf")
    with pytest.raises(path_routing.ConfError, match="no app line"):
        path_routing.parse("host a.example.com\ngateway g/g\n", "apps.conf")


def test_gateway_api_routes_strip_the_prefix_and_set_the_host():
    settings, apps = path_routing.parse(APPS, "apps.conf")
    text = path_routing.gateway_api(settings, apps, "# header\n")
    assert text.startswith("# header\n")
    assert text.count("\nkind: HTTPRoute\n") == 3
    assert "ReplacePrefixMatch" in text
    assert "search.default.svc.cluster.local" in text
    assert "kind: ReferenceGrant" in text


def test_istio_tries_the_longest_prefix_first():
    settings, apps = path_routing.parse(APPS, "apps.conf")
    text = path_routing.istio(settings, apps, "")
    assert text.index("prefix: /search/v2/") < text.index("prefix: /search/\n")
    assert "authority: login.auth.svc.cluster.local" in text
