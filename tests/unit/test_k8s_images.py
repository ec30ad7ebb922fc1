"""The test Kubernetes' images as OCI image layouts (tfos.testing.kubernetes.images): the stream
that ``ctr images import -`` reads names every layer by the digest of its bytes, in order."""

import hashlib
import io
import json
import tarfile

from tfos.testing.kubernetes.images import Image, Layer


def _layer(path, files: dict) -> Layer:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return Layer(path)


def test_an_image_of_two_layers_streams_as_an_oci_layout_whose_digests_match(tmp_path):
    low = _layer(tmp_path / "low.tar", {"etc/os": b"debian\n"})
    high = _layer(tmp_path / "high.tar", {"opt/tfos/x.py": b"print(1)\n"})
    assert low.digest == hashlib.sha256((tmp_path / "low.tar").read_bytes()).hexdigest()
    assert (tmp_path / "low.tar.sha256").read_text() == low.digest  # hashed once, kept beside the layer
    out = io.BytesIO()
    Image("tfos.local/x:1", [low, high], {"User": "185"}).write_oci(out)

    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1], name
    (entry,) = json.loads(blobs["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "tfos.local/x:1"
    manifest = json.loads(blobs["blobs/sha256/" + entry["digest"].split(":")[1]])
    assert [la["digest"] for la in manifest["layers"]] == [f"sha256:{low.digest}", f"sha256:{high.digest}"]
    assert [la["size"] for la in manifest["layers"]] == [low.size, high.size]
    config = json.loads(blobs["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["rootfs"]["diff_ids"] == [f"sha256:{low.digest}", f"sha256:{high.digest}"]
    assert config["config"] == {"User": "185"}


def test_a_layer_without_its_digest_is_not_ready(tmp_path):
    path = tmp_path / "l.tar"
    path.write_bytes(b"x" * 10)
    assert not Layer.ready(path)  # a build that stopped before its digest was written: built again
    Layer(path)
    assert Layer.ready(path)
