import io

from qproxy_tools.progress import Progress


def test_a_line_names_what_prints_it():
    out = io.StringIO()
    say = Progress("cluster", out)
    say("starting etcd")
    say("ready")
    assert out.getvalue() == "cluster: starting etcd\ncluster: ready\n"
