import json
import shutil

import pytest

from qproxy_tools import image_index, oci_image

INDEX = "application/vnd.oci.image.index.v1+json"

# A stand-in for readelf: the "binaries" are text files naming their
# machine on the first line, and "dynamic" on the second for one that asks
# for a loader.
READELF = """#!/bin/sh
file="$2"
case "$1" in
  -h) echo "ELF Header:"; echo "  Data:                              2's complement, little endian"
      echo "  Machine:                           $(head -n1 "$file")" ;;
  -lW) if grep -q dynamic "$file"; then echo "  INTERP         0x000318"; else echo "  LOAD           0x000000"; fi ;;
esac
"""


def raw_index(*platforms):
    return json.dumps({"mediaType": INDEX, "manifests": [{"platform": p} for p in platforms]})


def test_an_index_lists_its_platforms_in_order():
    raw = raw_index(
        {"os": "linux", "architecture": "amd64"},
        {"os": "linux", "architecture": "arm64", "variant": "v8"},
        {"os": "linux", "architecture": "ppc64le"},
    )
    assert image_index.platforms(raw) == ["amd64", "arm64", "ppc64le"]


def test_arm64_without_its_variant_and_a_single_manifest_are_refused():
    with pytest.raises(ValueError, match="variant"):
        image_index.platforms(raw_index({"os": "linux", "architecture": "arm64"}))
    with pytest.raises(ValueError, match="not an image index"):
        image_index.platforms(json.dumps({"mediaType": "application/vnd.oci.image.manifest.v1+json"}))
    with pytest.raises(ValueError, match="not linux"):
        image_index.platforms(raw_index({"os": "windows", "architecture": "amd64"}))


def test_an_image_for_another_architecture_or_with_two_layers_is_refused():
    image_index.architecture(json.dumps({"Architecture": "arm64"}), "arm64")
    with pytest.raises(ValueError, match="says amd64"):
        image_index.architecture(json.dumps({"Architecture": "amd64"}), "arm64")
    one = {"layers": [{"digest": "sha256:ab", "size": 7}]}
    assert image_index.layer(json.dumps(one), "amd64") == ("ab", 7)
    with pytest.raises(ValueError, match="2 layers"):
        image_index.layer(json.dumps({"layers": one["layers"] * 2}), "amd64")


def test_a_binary_for_another_machine_or_a_dynamic_one_is_named():
    header = "  Data: 2's complement, little endian\n  Machine:  AArch64\n"
    assert image_index.binary_problems(header, "  LOAD\n", "arm64") == []
    assert image_index.binary_problems(header, "  LOAD\n", "ppc64le") == [
        "ppc64le: the binary is for AArch64, not PowerPC64"
    ]
    assert image_index.binary_problems(header, "  INTERP\n", "arm64") == ["arm64: the binary asks for a dynamic loader"]
    big = "  Data: 2's complement, big endian\n  Machine:  PowerPC64\n"
    assert image_index.binary_problems(big, "", "ppc64le") == ["ppc64le: the binary is not little-endian"]


@pytest.mark.skipif(shutil.which("skopeo") is None, reason="needs skopeo: scripts/test installs it")
def test_skopeo_reads_the_packers_index_and_each_problem_is_named(tmp_path):
    readelf = tmp_path / "readelf"
    readelf.write_text(READELF)
    readelf.chmod(0o755)
    binaries = {}
    for arch, content in [
        ("amd64", "Advanced Micro Devices X86-64\n"),
        ("arm64", "AArch64\n"),
        ("ppc64le", "AArch64\ndynamic\n"),
    ]:
        path = tmp_path / f"qproxy-{arch}"
        path.write_text(content)
        binaries[arch] = str(path)
    archive = str(tmp_path / "index.tar")
    files, _ = oci_image.build_index(binaries, "qproxy", "qproxy:1.0", "1.0", 0)
    oci_image.write_archive(archive, files, 0)

    problems, sizes = image_index.check(archive, ["amd64", "arm64", "ppc64le"], "qproxy", 1 << 20, readelf=str(readelf))
    assert sorted(sizes) == ["amd64", "arm64", "ppc64le"]
    assert problems == [
        "ppc64le: the binary is for AArch64, not PowerPC64",
        "ppc64le: the binary asks for a dynamic loader",
    ]
    problems, _ = image_index.check(archive, ["amd64", "arm64"], "qproxy", 10, readelf=str(readelf))
    assert problems[0] == "the index lists ['amd64', 'arm64', 'ppc64le'], not ['amd64', 'arm64']"
    assert "amd64: the layer is" in problems[1] and "over 10" in problems[1]
