import gzip
import hashlib
import io
import json
import tarfile

from qproxy_tools import oci_image


def files_of(tmp_path, image="qproxy", mtime=0):
    binary = tmp_path / "bin"
    binary.write_bytes(b"\x7fELF not really")
    files, _ = oci_image.build(str(binary), image, "qproxy:1.0", "amd64", "1.0", mtime)
    return dict(files)


def test_the_same_binary_gives_the_same_bytes(tmp_path):
    assert files_of(tmp_path) == files_of(tmp_path)


def test_every_blob_is_named_by_its_digest_and_referenced_by_it(tmp_path):
    files = files_of(tmp_path)
    for path, data in files.items():
        if path.startswith("blobs/sha256/"):
            assert path.rsplit("/", 1)[1] == hashlib.sha256(data).hexdigest()
    index = json.loads(files["index.json"])
    manifest_digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads(files[f"blobs/sha256/{manifest_digest}"])
    assert "blobs/sha256/" + manifest["config"]["digest"].split(":")[1] in files
    assert "blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1] in files
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == "docker.io/library/qproxy:1.0"


def test_the_layer_holds_the_binary_and_the_users(tmp_path):
    files = files_of(tmp_path)
    manifest = json.loads(files["blobs/sha256/" + json.loads(files["index.json"])["manifests"][0]["digest"][7:]])
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(names["qproxy"]).read() == b"\x7fELF not really"
        assert names["qproxy"].mode == 0o755
        assert b"nonroot" in tar.extractfile(names["etc/passwd"]).read()


def test_the_sidecar_runs_as_nonroot_with_the_heap_settings(tmp_path):
    files = files_of(tmp_path)
    manifest = json.loads(files["blobs/sha256/" + json.loads(files["index.json"])["manifests"][0]["digest"][7:]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"][7:]])
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["/qproxy"]
    assert any(e.startswith("GLIBC_TUNABLES=") for e in config["config"]["Env"])
    assert "8012/tcp" in config["config"]["ExposedPorts"]


def test_names_as_containerd_spells_them():
    assert oci_image.qualified("qproxy:1") == "docker.io/library/qproxy:1"
    assert oci_image.qualified("me/qproxy:1") == "docker.io/me/qproxy:1"
    assert oci_image.qualified("ko.local/qproxy:1") == "ko.local/qproxy:1"
    assert oci_image.qualified("localhost/qproxy:1") == "localhost/qproxy:1"


def test_the_archive_is_written_whole(tmp_path):
    binary = tmp_path / "bin"
    binary.write_bytes(b"x")
    files, _ = oci_image.build(str(binary), "qproxy-accel", "qproxy-accel:1", "amd64", "1", 0)
    out = tmp_path / "image.tar"
    oci_image.write_archive(str(out), files, 0)
    with tarfile.open(out) as tar:
        assert [m.name for m in tar.getmembers() if m.isfile()] == [path for path, _ in files]


def index_of(tmp_path, arches):
    binaries = {}
    for arch in arches:
        binary = tmp_path / f"bin-{arch}"
        binary.write_bytes(b"\x7fELF for " + arch.encode())
        binaries[arch] = str(binary)
    files, sizes = oci_image.build_index(binaries, "qproxy", "qproxy:1.0", "1.0", 0)
    return dict(files), sizes


def test_an_index_has_a_manifest_per_platform_each_with_its_own_binary(tmp_path):
    files, sizes = index_of(tmp_path, ["amd64", "arm64", "ppc64le"])
    assert set(sizes) == {"amd64", "arm64", "ppc64le"}
    [top] = json.loads(files["index.json"])["manifests"]
    assert top["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert top["annotations"]["io.containerd.image.name"] == "docker.io/library/qproxy:1.0"
    index = json.loads(files["blobs/sha256/" + top["digest"][7:]])
    platforms = [m["platform"] for m in index["manifests"]]
    assert platforms == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux", "variant": "v8"},
        {"architecture": "ppc64le", "os": "linux"},
    ]
    for entry in index["manifests"]:
        manifest = json.loads(files["blobs/sha256/" + entry["digest"][7:]])
        config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"][7:]])
        assert config["architecture"] == entry["platform"]["architecture"]
        layer = files["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
            binary = tar.extractfile("qproxy").read()
        assert binary == b"\x7fELF for " + entry["platform"]["architecture"].encode()
    assert index_of(tmp_path, ["amd64", "arm64", "ppc64le"])[0] == files, "the same bytes again"


def test_docker_s_manifest_names_the_first_platform(tmp_path):
    files, _ = index_of(tmp_path, ["arm64", "amd64"])
    [entry] = json.loads(files["manifest.json"])
    config = json.loads(files[entry["Config"]])
    assert config["architecture"] == "arm64"
    assert entry["RepoTags"] == ["qproxy:1.0"]
