"""S3 against a real moto server over HTTP: download, list, read, endpoints and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving_pod.storage import StorageError, download, list_objects, read
from serving_pod.storage.cli import main
from serving_pod.storage.uris import StorageNotFoundError


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_download_prefix_with_endpoint_in_uri(bucket, tmp_path: Path, s3_env: str) -> None:
    _, name = bucket
    download(f"s3://{s3_env}/{name}/repo", tmp_path / "models")
    assert _tree(tmp_path / "models") == {
        "simple/config.pbtxt": b'name: "simple"\n',
        "simple/1/model.onnx": b"\x08\x01onnx",
        "other/1/model.onnx": b"other",
    }


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "S3_ENDPOINT"])
def test_download_with_endpoint_from_env(
    bucket, tmp_path: Path, s3_env: str, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    _, name = bucket
    if variable == "S3_ENDPOINT":
        monkeypatch.setenv("S3_ENDPOINT", s3_env)
        monkeypatch.setenv("S3_USE_HTTPS", "0")
    else:
        monkeypatch.setenv(variable, f"http://{s3_env}")
    download(f"s3://{name}/repo/simple", tmp_path)
    assert sorted(_tree(tmp_path)) == ["1/model.onnx", "config.pbtxt"]


def test_whole_bucket_and_single_object(bucket, tmp_path: Path, s3_env: str) -> None:
    client, name = bucket
    download(f"s3://{s3_env}/{name}", tmp_path / "all")
    assert "repository-sibling/x" in _tree(tmp_path / "all")
    download(f"s3://{s3_env}/{name}/repo/other/1/model.onnx", tmp_path / "one")
    assert _tree(tmp_path / "one") == {"model.onnx": b"other"}


def test_single_archive_object_is_extracted(bucket, tmp_path: Path, s3_env: str) -> None:
    import io
    import tarfile

    client, name = bucket
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        data = b'name: "packed"\n'
        info = tarfile.TarInfo("packed/config.pbtxt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    client.put_object(Bucket=name, Key="archives/packed.tar.gz", Body=buffer.getvalue())
    download(f"s3://{s3_env}/{name}/archives/packed.tar.gz", tmp_path)
    assert _tree(tmp_path) == {"packed/config.pbtxt": b'name: "packed"\n'}


def test_list_and_read(bucket, s3_env: str) -> None:
    _, name = bucket
    objects = list_objects(f"s3://{s3_env}/{name}/repo")
    assert sorted(o.key for o in objects) == ["other/1/model.onnx", "simple/1/model.onnx", "simple/config.pbtxt"]
    config = next(o for o in objects if o.key == "simple/config.pbtxt")
    assert config.size == len(b'name: "simple"\n') and config.etag and config.last_modified
    assert read(f"s3://{s3_env}/{name}/repo/simple/config.pbtxt") == b'name: "simple"\n'


def test_changes_are_visible_to_pollers(bucket, s3_env: str) -> None:
    client, name = bucket
    before = {o.key: o.etag for o in list_objects(f"s3://{s3_env}/{name}/repo/simple")}
    client.put_object(Bucket=name, Key="repo/simple/config.pbtxt", Body=b'name: "simple"\nmax_batch_size: 8\n')
    after = {o.key: o.etag for o in list_objects(f"s3://{s3_env}/{name}/repo/simple")}
    assert before.keys() == after.keys() and before["config.pbtxt"] != after["config.pbtxt"]


def test_missing_prefix_and_bucket(bucket, tmp_path: Path, s3_env: str) -> None:
    _, name = bucket
    with pytest.raises(StorageNotFoundError, match="not found"):
        download(f"s3://{s3_env}/{name}/nope", tmp_path)
    with pytest.raises(StorageError, match="no-such-bucket"):
        download(f"s3://{s3_env}/no-such-bucket/x", tmp_path)
    with pytest.raises(StorageNotFoundError):
        read(f"s3://{s3_env}/{name}/repo/simple/missing.txt")


def test_anonymous_access_to_private_bucket_is_refused_clearly(bucket, tmp_path: Path, s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, name = bucket
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never probe the instance metadata address
    monkeypatch.setenv("AWS_ANONYMOUS", "true")
    with pytest.raises(StorageError, match=f"s3://{s3_env}/{name}/repo/simple: failed while .*Forbidden"):
        download(f"s3://{s3_env}/{name}/repo/simple", tmp_path)


def test_cli(bucket, tmp_path: Path, s3_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, name = bucket
    assert main([f"s3://{s3_env}/{name}/repo", str(tmp_path / "m"), "--quiet"]) == 0
    assert (tmp_path / "m" / "simple" / "config.pbtxt").exists()
    assert main([f"s3://{s3_env}/{name}/absent", str(tmp_path / "n")]) == 1
    assert "ferry-server download: error:" in capsys.readouterr().err
    assert main(["only-one-arg"]) == 2
