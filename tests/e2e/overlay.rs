//! The install paths in `knative-overlay/` and the examples in `deploy/`,
//! rendered by kustomize (`kubectl kustomize`, or the command in
//! `QPROXY_KUSTOMIZE`) and checked field by field.

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    qproxy_test_support::workspace()
        .canonicalize()
        .expect("repository root")
}

fn overlay(path: &str) -> PathBuf {
    repo().join("knative-overlay").join(path)
}

/// A fresh folder for one test. It lies inside the repository (under
/// `target/`), so kustomizations written there can name the overlay's
/// components by relative path, as kustomize requires.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("overlay")
        .join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch folder");
    dir.canonicalize().expect("scratch folder")
}

/// `to` relative to the folder `from`; both absolute.
fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path.to_string_lossy().into_owned()
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn kustomize_output(dir: &Path) -> Output {
    let custom = std::env::var("QPROXY_KUSTOMIZE").ok();
    let words: Vec<&str> = match &custom {
        Some(command) => command.split_whitespace().collect(),
        None => vec!["kubectl", "kustomize"],
    };
    Command::new(words[0])
        .args(&words[1..])
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", words.join(" ")))
}

/// The objects kustomize renders from the kustomization in `dir`.
fn render(dir: &Path) -> Vec<Value> {
    let out = kustomize_output(dir);
    assert!(
        out.status.success(),
        "kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml(&String::from_utf8_lossy(&out.stdout))
}

/// kustomize's error for the kustomization in `dir`, which must fail.
fn render_error(dir: &Path) -> String {
    let out = kustomize_output(dir);
    assert!(
        !out.status.success(),
        "kustomize {} succeeded",
        dir.display()
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every document of a YAML stream, as JSON values, scalars typed as YAML
/// types them (so an unquoted `3` is a number, not the string an annotation
/// needs).
fn yaml(text: &str) -> Vec<Value> {
    fn convert(node: &Yaml) -> Value {
        match node {
            Yaml::Real(r) => r
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or(Value::Null, Value::Number),
            Yaml::Integer(i) => json!(i),
            Yaml::String(s) => json!(s),
            Yaml::Boolean(b) => json!(b),
            Yaml::Array(items) => Value::Array(items.iter().map(convert).collect()),
            Yaml::Hash(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let key = match k {
                            Yaml::String(s) => s.clone(),
                            other => format!("{other:?}"),
                        };
                        (key, convert(v))
                    })
                    .collect(),
            ),
            Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
        }
    }
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("kustomize wrote YAML: {e}\n{text}"))
        .iter()
        .map(convert)
        .filter(|doc| !doc.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name} in {objects:#?}");
    found[0]
}

/// The image base/ puts in config-deployment: the one the README and the
/// operator resource name too.
fn image() -> String {
    let patch = yaml(&fs::read_to_string(overlay("base/queue-sidecar-image.yaml")).expect("patch"));
    patch[0]["data"]["queue-sidecar-image"]
        .as_str()
        .expect("the patch sets queue-sidecar-image")
        .to_owned()
}

/// base/, copied with serving-core.yaml replaced by the test fixture.
fn base_over_fixture(dir: &Path) -> PathBuf {
    let base = dir.join("base");
    fs::create_dir_all(&base).expect("base copy");
    let kustomization = fs::read_to_string(overlay("base/kustomization.yaml")).expect("base");
    let release = yaml(&kustomization)[0]["resources"][0]
        .as_str()
        .expect("one resource")
        .to_owned();
    let version = release
        .strip_prefix("https://github.com/knative/serving/releases/download/knative-v")
        .and_then(|rest| rest.strip_suffix("/serving-core.yaml"))
        .unwrap_or_else(|| panic!("base/ takes serving-core.yaml of a release: {release}"));
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|n| n.parse::<u32>().is_ok()),
        "a release version: {version}"
    );
    write(
        &base.join("kustomization.yaml"),
        &kustomization.replace(&release, "serving-core.yaml"),
    );
    fs::copy(
        overlay("base/queue-sidecar-image.yaml"),
        base.join("queue-sidecar-image.yaml"),
    )
    .expect("patch copy");
    fs::copy(fixture(), base.join("serving-core.yaml")).expect("fixture copy");
    base
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/serving-core.yaml")
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn base_points_config_deployment_at_qproxy_and_changes_nothing_else() {
    let dir = scratch("base");
    let rendered = render(&base_over_fixture(&dir));
    let original = yaml(&fs::read_to_string(fixture()).expect("fixture"));
    assert_eq!(rendered.len(), original.len(), "{rendered:#?}");

    let config = find(&rendered, "ConfigMap", "config-deployment");
    assert_eq!(config["data"]["queue-sidecar-image"], image().as_str());
    // The rest of every object is as Knative ships it.
    let mut expected = find(&original, "ConfigMap", "config-deployment").clone();
    expected["data"]["queue-sidecar-image"] = json!(image());
    assert_eq!(config, &expected);
    for object in &original {
        let name = object["metadata"]["name"].as_str().expect("named");
        let kind = object["kind"].as_str().expect("kind");
        if (kind, name) != ("ConfigMap", "config-deployment") {
            assert_eq!(find(&rendered, kind, name), object);
        }
    }
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn sidecar_requests_component_sizes_the_sidecar_for_qproxy() {
    let dir = scratch("sidecar-requests");
    base_over_fixture(&dir);
    let with = dir.join("with-requests");
    fs::create_dir_all(&with).expect("folder");
    write(
        &with.join("kustomization.yaml"),
        &format!(
            "resources:\n  - ../base\ncomponents:\n  - {}\n",
            relative(&with, &overlay("components/sidecar-requests"))
        ),
    );
    let rendered = render(&with);
    let data = &find(&rendered, "ConfigMap", "config-deployment")["data"];
    assert_eq!(data["queue-sidecar-image"], image().as_str());
    assert_eq!(data["queue-sidecar-cpu-request"], "25m");
    assert_eq!(data["queue-sidecar-memory-request"], "40Mi");
    for limit in ["queue-sidecar-cpu-limit", "queue-sidecar-memory-limit"] {
        assert!(data.get(limit).is_none(), "no {limit}: {data}");
    }
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn operator_resource_sets_the_same_image_through_the_operator() {
    let rendered = render(&overlay("operator"));
    assert_eq!(rendered.len(), 1, "{rendered:#?}");
    let serving = &rendered[0];
    assert_eq!(serving["apiVersion"], "operator.knative.dev/v1beta1");
    assert_eq!(serving["kind"], "KnativeServing");
    assert_eq!(serving["metadata"]["name"], "knative-serving");
    assert_eq!(serving["metadata"]["namespace"], "knative-serving");
    assert_eq!(
        serving["spec"]["config"]["deployment"]["queue-sidecar-image"],
        image().as_str()
    );
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn readme_names_the_image_the_overlays_set() {
    let readme = fs::read_to_string(overlay("README.md")).expect("README");
    assert!(
        readme.contains(&format!("\"queue-sidecar-image\":\"{}\"", image())),
        "the README's kubectl patch sets {}",
        image()
    );
}

const SERVICES: &str = "\
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: fresh
  namespace: apps
spec:
  template:
    spec:
      containers:
        - image: example.com/app
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: annotated
spec:
  template:
    metadata:
      annotations:
        autoscaling.knative.dev/min-scale: \"9\"
        autoscaling.knative.dev/metric: rps
    spec:
      containers:
        - image: example.com/app
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: not-knative
spec:
  template:
    spec:
      containers:
        - image: example.com/app
";

const SETTINGS: &str = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: activator-bypass
  annotations:
    config.kubernetes.io/local-config: \"true\"
data:
  min-scale: \"3\"
";

fn bypass_kustomization(dir: &Path, with_settings: bool) {
    write(&dir.join("services.yaml"), SERVICES);
    write(&dir.join("settings.yaml"), SETTINGS);
    write(
        &dir.join("kustomization.yaml"),
        &format!(
            "resources:\n  - services.yaml\n{}components:\n  - {}\n",
            if with_settings {
                "  - settings.yaml\n"
            } else {
                ""
            },
            relative(dir, &overlay("components/activator-bypass"))
        ),
    );
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn activator_bypass_pins_min_scale_and_zeroes_burst_capacity() {
    let dir = scratch("activator-bypass");
    bypass_kustomization(&dir, true);
    let rendered = render(&dir);
    assert_eq!(
        rendered.len(),
        3,
        "the settings are not emitted: {rendered:#?}"
    );

    for name in ["fresh", "annotated"] {
        let annotations =
            &find(&rendered, "Service", name)["spec"]["template"]["metadata"]["annotations"];
        // Strings, as the API server requires of annotations.
        assert_eq!(
            annotations["autoscaling.knative.dev/min-scale"],
            json!("3"),
            "{name}"
        );
        assert_eq!(
            annotations["autoscaling.knative.dev/target-burst-capacity"],
            json!("0"),
            "{name}"
        );
    }
    let kept =
        &find(&rendered, "Service", "annotated")["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(kept["autoscaling.knative.dev/metric"], "rps");
    assert_eq!(
        find(&rendered, "Deployment", "not-knative"),
        &yaml(SERVICES)[2],
        "only Knative Services change"
    );
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn activator_bypass_without_a_min_scale_is_an_error() {
    let dir = scratch("activator-bypass-unset");
    bypass_kustomization(&dir, false);
    let error = render_error(&dir);
    assert!(error.contains("activator-bypass"), "{error}");
}

fn generate(conf: &Path, out: &Path) -> Output {
    Command::new("python3")
        .arg(overlay("components/path-routing/generate.py"))
        .arg(conf)
        .arg("--out")
        .arg(out)
        .output()
        .expect("python3 runs")
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn path_routing_components_are_the_generators_output_for_apps_conf() {
    let dir = scratch("path-routing-committed");
    let out = generate(&overlay("components/path-routing/apps.conf"), &dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "gateway-api/kustomization.yaml",
        "gateway-api/routes.yaml",
        "istio/kustomization.yaml",
        "istio/routes.yaml",
    ] {
        assert_eq!(
            fs::read_to_string(dir.join(file)).expect("generated"),
            fs::read_to_string(overlay("components/path-routing").join(file)).expect("committed"),
            "{file} is out of date: run knative-overlay/components/path-routing/generate.py"
        );
    }
}

const TWO_APPS: &str = "\
host            shop.example.org
gateway         edge/public/https   # a listener by name
ingress         kourier-system/kourier-internal:80
domain          example.org
istio-gateway   edge/shop
istio-namespace edge
app search  default /search
app cart    shop    /shop/cart      # nested prefix
";

/// A scratch folder holding the generator's output for [`TWO_APPS`].
fn generated_two_apps(name: &str) -> PathBuf {
    let dir = scratch(name);
    write(&dir.join("apps.conf"), TWO_APPS);
    let out = generate(&dir.join("apps.conf"), &dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Renders one generated flavour through a kustomization that includes it.
fn render_flavour(dir: &Path, flavour: &str) -> Vec<Value> {
    let user = dir.join(format!("user-{flavour}"));
    fs::create_dir_all(&user).expect("folder");
    write(
        &user.join("kustomization.yaml"),
        &format!("components:\n  - ../{flavour}\n"),
    );
    render(&user)
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn path_routing_for_two_apps_yields_one_gateway_api_route_each() {
    let dir = generated_two_apps("path-routing-gateway-api");
    let rendered = render_flavour(&dir, "gateway-api");
    assert_eq!(rendered.len(), 3, "{rendered:#?}");

    for (name, namespace, prefix) in [
        ("search", "default", "/search"),
        ("cart", "shop", "/shop/cart"),
    ] {
        let route = find(&rendered, "HTTPRoute", &format!("{name}-path-routing"));
        assert_eq!(route["apiVersion"], "gateway.networking.k8s.io/v1");
        assert_eq!(route["metadata"]["namespace"], namespace);
        assert_eq!(
            route["spec"]["parentRefs"],
            json!([{"name": "public", "namespace": "edge", "sectionName": "https"}])
        );
        assert_eq!(route["spec"]["hostnames"], json!(["shop.example.org"]));
        assert_eq!(
            route["spec"]["rules"],
            json!([{
                "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
                "filters": [{
                    "type": "URLRewrite",
                    "urlRewrite": {
                        "hostname": format!("{name}.{namespace}.example.org"),
                        "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"},
                    },
                }],
                "backendRefs": [{"name": "kourier-internal", "namespace": "kourier-system", "port": 80}],
            }])
        );
    }

    let grant = find(&rendered, "ReferenceGrant", "path-routing");
    assert_eq!(grant["metadata"]["namespace"], "kourier-system");
    assert_eq!(
        grant["spec"],
        json!({
            "from": [
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "default"},
                {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"},
            ],
            "to": [{"group": "", "kind": "Service", "name": "kourier-internal"}],
        })
    );
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn path_routing_for_two_apps_yields_one_istio_route_each_longest_prefix_first() {
    let dir = generated_two_apps("path-routing-istio");
    let rendered = render_flavour(&dir, "istio");
    assert_eq!(rendered.len(), 1, "{rendered:#?}");

    let service = find(&rendered, "VirtualService", "path-routing");
    assert_eq!(service["metadata"]["namespace"], "edge");
    assert_eq!(service["spec"]["gateways"], json!(["edge/shop"]));
    assert_eq!(service["spec"]["hosts"], json!(["shop.example.org"]));
    let route = |name: &str, namespace: &str, prefix: &str| {
        json!({
            "name": format!("{name}-{namespace}"),
            "match": [{"uri": {"prefix": format!("{prefix}/")}}, {"uri": {"exact": prefix}}],
            "rewrite": {"uri": "/", "authority": format!("{name}.{namespace}.example.org")},
            "route": [{"destination": {
                "host": "kourier-internal.kourier-system.svc.cluster.local",
                "port": {"number": 80},
            }}],
        })
    };
    assert_eq!(
        service["spec"]["http"],
        json!([
            route("cart", "shop", "/shop/cart"),
            route("search", "default", "/search")
        ])
    );
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn path_routing_generator_names_the_line_of_a_bad_entry() {
    let dir = scratch("path-routing-bad");
    let header = "host a.example.com\ngateway gw/public\n";
    for (body, line, says) in [
        ("app search default search\n", 3, "must start with '/'"),
        ("app search default /search/\n", 3, "not end with one"),
        (
            "app a default /x\napp b default /x\n",
            4,
            "already routed to a",
        ),
        ("app Search default /x\n", 3, "not a DNS label"),
        (
            "app search default\n",
            3,
            "takes a name, a namespace and a path prefix",
        ),
        ("hots b.example.com\n", 3, "unknown setting 'hots'"),
    ] {
        write(&dir.join("apps.conf"), &format!("{header}{body}"));
        let out = generate(&dir.join("apps.conf"), &dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{body}: {stderr}");
        assert!(
            stderr.contains(&format!("apps.conf:{line}:")) && stderr.contains(says),
            "{body}: {stderr}"
        );
        assert!(!dir.join("istio").exists(), "nothing written for {body}");
    }
    write(&dir.join("apps.conf"), "app search default /search\n");
    let out = generate(&dir.join("apps.conf"), &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no host line"), "{stderr}");
}

#[test]
#[ignore = "needs kustomize and Python: scripts/test installs them"]
fn examples_are_knative_services_with_the_settings_they_show() {
    let rendered = render(&repo().join("deploy/examples"));
    assert_eq!(rendered.len(), 3, "{rendered:#?}");
    for service in &rendered {
        assert_eq!(service["apiVersion"], "serving.knative.dev/v1");
        assert_eq!(service["kind"], "Service");
    }
    let spec = |name: &str| find(&rendered, "Service", name)["spec"]["template"]["spec"].clone();

    assert_eq!(
        spec("grpc")["containers"][0]["ports"][0]["name"],
        "h2c",
        "HTTP/2 all the way to the app"
    );
    let limits = spec("limits");
    assert_eq!(limits["containerConcurrency"], 4);
    assert_eq!(limits["timeoutSeconds"], 60);
    assert_eq!(limits["responseStartTimeoutSeconds"], 10);
    assert_eq!(limits["idleTimeoutSeconds"], 30);
    assert!(spec("hello").get("containerConcurrency").is_none());

    let pinned = render(&repo().join("deploy/examples/latency-critical"));
    assert_eq!(pinned.len(), 1, "{pinned:#?}");
    let annotations = &pinned[0]["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["autoscaling.knative.dev/min-scale"], json!("2"));
    assert_eq!(
        annotations["autoscaling.knative.dev/target-burst-capacity"],
        json!("0")
    );
}
