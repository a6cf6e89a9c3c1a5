"""http(s), file://, plain paths, pvc:// and gs:// (without its client) through the public API."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from serving_pod.storage import StorageError, download, list_objects, read
from serving_pod.storage.uris import StorageNotFoundError


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _repo(root: Path) -> Path:
    (root / "simple" / "1").mkdir(parents=True)
    (root / "simple" / "config.pbtxt").write_bytes(b'name: "simple"\n')
    (root / "simple" / "1" / "model.onnx").write_bytes(b"onnx")
    return root


def _targz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_http_single_file(http_root, tmp_path: Path) -> None:
    root, url = http_root
    (root / "model.onnx").write_bytes(b"weights")
    download(f"{url}/model.onnx", tmp_path / "m")
    assert _tree(tmp_path / "m") == {"model.onnx": b"weights"}
    assert read(f"{url}/model.onnx") == b"weights"


@pytest.mark.parametrize("archive", ["repo.tar.gz", "repo.tgz", "repo.zip"])
def test_http_archives_are_extracted(http_root, tmp_path: Path, archive: str) -> None:
    root, url = http_root
    members = {"simple/config.pbtxt": b'name: "simple"\n', "simple/1/model.onnx": b"onnx"}
    if archive.endswith(".zip"):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        (root / archive).write_bytes(buffer.getvalue())
    else:
        (root / archive).write_bytes(_targz(members))
    download(f"{url}/{archive}", tmp_path / "m")
    assert _tree(tmp_path / "m") == members


def test_archive_escaping_dest_is_refused(http_root, tmp_path: Path) -> None:
    root, url = http_root
    (root / "evil.tar.gz").write_bytes(_targz({"../outside.txt": b"x"}))
    with pytest.raises(StorageError, match="cannot extract archive evil.tar.gz"):
        download(f"{url}/evil.tar.gz", tmp_path / "m")
    assert not (tmp_path / "outside.txt").exists()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("../../escape.txt", b"x")
    (root / "evil.zip").write_bytes(buffer.getvalue())
    with pytest.raises(StorageError, match="escape"):
        download(f"{url}/evil.zip", tmp_path / "z")


def test_http_errors(http_root, tmp_path: Path) -> None:
    _, url = http_root
    with pytest.raises(StorageNotFoundError, match="HTTP 404"):
        download(f"{url}/absent.onnx", tmp_path)
    with pytest.raises(StorageError, match="must name a file"):
        download(f"{url}/", tmp_path)
    with pytest.raises(StorageError, match="listing is not supported"):
        list_objects(f"{url}/model.onnx")
    with pytest.raises(StorageError, match="cannot connect"):
        download("http://127.0.0.1:9/x.onnx", tmp_path)  # discard port: nothing listens


@pytest.mark.parametrize("form", ["file", "plain"])
def test_local_copy(tmp_path: Path, form: str) -> None:
    source = _repo(tmp_path / "src")
    uri = f"file://{source}" if form == "file" else str(source)
    download(uri, tmp_path / "dest")
    assert _tree(tmp_path / "dest") == _tree(source)
    assert sorted(o.key for o in list_objects(uri)) == ["simple/1/model.onnx", "simple/config.pbtxt"]
    assert read(f"{uri}/simple/config.pbtxt") == b'name: "simple"\n'


def test_local_missing_and_dest_is_a_file(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError, match="does not exist"):
        download(str(tmp_path / "absent"), tmp_path / "dest")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="is not a folder"):
        download(str(_repo(tmp_path / "src")), tmp_path / "file")


def test_pvc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_PVC_ROOT", str(tmp_path / "pvc"))
    _repo(tmp_path / "pvc" / "claim" / "models")
    download("pvc://claim/models", tmp_path / "dest")
    assert sorted(_tree(tmp_path / "dest")) == ["simple/1/model.onnx", "simple/config.pbtxt"]
    with pytest.raises(StorageNotFoundError, match="claim 'other' is not mounted"):
        download("pvc://other/models", tmp_path / "dest2")
    with pytest.raises(StorageNotFoundError, match="does not exist"):
        download("pvc://claim/absent", tmp_path / "dest3")


def test_gs_without_client_says_what_to_install(tmp_path: Path) -> None:
    try:
        import google.cloud.storage  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("google-cloud-storage is installed; this test covers its absence")
    with pytest.raises(StorageError, match=r"pip install 'ferry\[gcs\]'"):
        download("gs://bucket/models", tmp_path)
