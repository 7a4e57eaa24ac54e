from qproxy_tools import oci_image
from qproxy_tools.cluster import build, cli

# `ctr images ls` as containerd prints it (digests shortened).
LISTING = "\n".join(
    [
        "REF                       TYPE                                       DIGEST          SIZE    PLATFORMS"
        "                  LABELS",
        "ko.local/qproxy:0.1.0-abc application/vnd.oci.image.index.v1+json    sha256:853aca52 5.2 MiB "
        "linux/amd64,linux/arm64/v8 io.cri-containerd.image=managed",
        "ko.local/helloworld:e2e   application/vnd.oci.image.manifest.v1+json sha256:0c1d7d1b 2.1 MiB "
        "linux/amd64                -",
    ]
)


def test_the_platforms_of_an_index_containerd_holds():
    assert cli.held_platforms(LISTING, "ko.local/qproxy:0.1.0-abc") == ["linux/amd64", "linux/arm64/v8"]
    # One image, not an index; and one containerd does not hold.
    assert cli.held_platforms(LISTING, "ko.local/helloworld:e2e") is None
    assert cli.held_platforms(LISTING, "ko.local/other:1") is None


def test_the_name_and_platforms_an_archive_gives(tmp_path):
    binaries = {}
    for arch in ("amd64", "arm64", "ppc64le"):
        path = tmp_path / arch
        path.write_bytes(b"\x7fELF")
        binaries[arch] = str(path)
    several = str(tmp_path / "index.tar")
    files, _ = oci_image.build_index(binaries, "qproxy", "qproxy:1.0", "1.0", 0)
    oci_image.write_archive(several, files, 0)
    assert cli.archive_image(several) == (
        "docker.io/library/qproxy:1.0",
        ["linux/amd64", "linux/arm64/v8", "linux/ppc64le"],
    )
    one = str(tmp_path / "one.tar")
    files, _ = oci_image.build_index({"amd64": binaries["amd64"]}, "qproxy", "qproxy:1.0", "1.0", 0)
    oci_image.write_archive(one, files, 0)
    assert cli.archive_image(one) == ("docker.io/library/qproxy:1.0", [])


def test_the_image_carries_this_machine_first_then_the_others_asked_for():
    assert build.image_platforms({})[0] == build.ARCH
    assert build.image_platforms({})[1:] == [a for a in ("arm64", "ppc64le") if a != build.ARCH]
    assert build.image_platforms({"QPROXY_MULTIARCH": ""}) == [build.ARCH]
    assert build.image_platforms({"QPROXY_MULTIARCH": f"{build.ARCH} arm64"}) == [build.ARCH] + (
        [] if build.ARCH == "arm64" else ["arm64"]
    )
