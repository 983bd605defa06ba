"""Tests for gears_ddp.data.download against a local HTTP server on 127.0.0.1 (never the internet)."""

import io
import logging
import os
import pickle
import re
import socket
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from gears_ddp.data import download as dl


def _zip_bytes(members: dict) -> bytes:
    """A zip archive holding ``members`` (name -> bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _tar_gz_bytes(members: dict, symlinks: dict = None) -> bytes:
    """A gzip-compressed tar archive holding ``members`` (name -> bytes) and ``symlinks`` (name -> target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return buf.getvalue()


def _npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


PICKLED = {"GENE1": {"GO:0000001"}, "GENE2": {"GO:0000002"}}
HTML = b"<!DOCTYPE html><html><body>Dataverse error</body></html>"
OCTET = "application/octet-stream"

# path -> (status, content type, body, Content-Length override)
ROUTES = {
    "mini_zip": (200, OCTET, _zip_bytes({"mini/perturb_processed.h5ad": b"h5ad bytes"}), None),
    "wrong_zip": (200, OCTET, _zip_bytes({"other/readme.txt": b"x"}), None),
    "pickle": (200, OCTET, pickle.dumps(PICKLED), None),
    "go_tar": (200, OCTET, _tar_gz_bytes({"go_essential_all/go_essential_all.csv": b"source,target\n"}), None),
    "html": (200, "text/html; charset=utf-8", HTML, None),
    "html_body": (200, OCTET, b"\n  " + HTML, None),
    "not_pickle": (200, OCTET, b"definitely not a pickle", None),
    "genes_npy": (200, OCTET, _npy_bytes(np.array(["G0", "G1"], dtype=object)), None),
    "missing": (404, "text/plain", b"not found", None),
    "broken": (500, "text/plain", b"server error", None),
    "truncated": (200, OCTET, pickle.dumps(PICKLED), 10_000),
    "slip_zip": (200, OCTET, _zip_bytes({"../evil.txt": b"pwned"}), None),
    "abs_tar": (200, OCTET, _tar_gz_bytes({"/tmp/gears_ddp_evil.txt": b"pwned"}), None),
    "link_tar": (200, OCTET, _tar_gz_bytes({}, {"go_essential_all/go_essential_all.csv": "/etc/passwd"}), None),
}


REFUSING_PREFIX = "/refusing/"


class _Handler(BaseHTTPRequestHandler):
    """Serves ``ROUTES`` by the last path component and counts requests on the server."""

    def do_GET(self):  # noqa: N802 (http.server naming)
        self.server.requests.append(self.path)
        if self.path.startswith(REFUSING_PREFIX):  # as Harvard Dataverse answers scripted requests
            status, ctype, body, length = 403, "text/html", b"<html><body>Forbidden</body></html>", None
        else:
            status, ctype, body, length = ROUTES[self.path.rsplit("/", 1)[-1]]
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length or len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        """Keep test output quiet."""


@pytest.fixture
def server(monkeypatch):
    """A local file server; GEARS_DDP_DATAVERSE_URL points at it. Yields the server (``.requests`` lists paths)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.requests = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    monkeypatch.setenv(dl.DATAVERSE_URL_ENV, f"http://127.0.0.1:{httpd.server_address[1]}/api/access/datafile")
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def closed_port_url(monkeypatch):
    """GEARS_DDP_DATAVERSE_URL pointing at a 127.0.0.1 port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api/access/datafile/"
    monkeypatch.setenv(dl.DATAVERSE_URL_ENV, url)
    return url


def _url(route: str) -> str:
    """The URL the module builds for file id ``route``."""
    return dl.dataverse_url() + route


def _files(folder):
    """Every file and folder under ``folder`` (temp files included), as sorted relative names."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_dataverse_url_default_and_override(monkeypatch):
    monkeypatch.delenv(dl.DATAVERSE_URL_ENV, raising=False)
    assert dl.dataverse_url() == dl.DATAVERSE_URL
    monkeypatch.setenv(dl.DATAVERSE_URL_ENV, "http://127.0.0.1:1/files")
    assert dl.dataverse_url() == "http://127.0.0.1:1/files/"


def test_published_ids():
    assert dl.DATASET_FILE_IDS["norman"] == 6154020
    assert set(dl.DATASET_FILE_IDS) == {
        "norman",
        "adamson",
        "dixit",
        "replogle_k562_essential",
        "replogle_rpe1_essential",
    }
    assert dl.GO_FILE_IDS == {
        "gene2go_all.pkl": 6153417,
        "essential_all_data_pert_genes.pkl": 6934320,
        "go_essential_all": 6934319,
    }


def test_download_file_pickle(server, tmp_path):
    dest = dl.download_file(_url("pickle"), tmp_path / "sub" / "g.pkl", "pickle")
    assert dest == tmp_path / "sub" / "g.pkl"
    assert pickle.loads(dest.read_bytes()) == PICKLED
    assert _files(tmp_path) == ["sub", "sub/g.pkl"]


@pytest.mark.parametrize(
    "route, kind, match",
    [
        ("html", "pickle", "HTML page"),
        ("html_body", "pickle", "HTML page"),
        ("missing", "pickle", "HTTP status 404"),
        ("broken", "pickle", "HTTP status 500"),
        ("truncated", "pickle", "truncated download"),
        ("not_pickle", "pickle", "not a valid pickle file"),
        ("pickle", "zip", "not a valid zip file"),
        ("pickle", "tar", "not a valid tar file"),
    ],
)
def test_download_file_rejects_bad_responses(server, tmp_path, route, kind, match):
    dest = tmp_path / "out.bin"
    with pytest.raises(dl.DownloadError, match=match) as info:
        dl.download_file(_url(route), dest, kind)
    assert _url(route) in str(info.value) and str(dest) in str(info.value)
    assert _files(tmp_path) == []


def test_failed_download_keeps_previous_file(server, tmp_path):
    dest = tmp_path / "g.pkl"
    dest.write_bytes(b"previous")
    with pytest.raises(dl.DownloadError):
        dl.download_file(_url("truncated"), dest, "pickle")
    assert dest.read_bytes() == b"previous"
    assert _files(tmp_path) == ["g.pkl"]


def test_download_file_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="unknown kind"):
        dl.download_file("http://127.0.0.1:1/x", tmp_path / "x", "csv")


def test_ensure_dataset_downloads_extracts_and_reuses(server, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(dl.DATASET_FILE_IDS, "mini", "mini_zip")
    folder = dl.ensure_dataset("mini", tmp_path)
    assert folder == tmp_path / "mini"
    assert (folder / "perturb_processed.h5ad").read_bytes() == b"h5ad bytes"
    assert _files(tmp_path) == ["mini", "mini/perturb_processed.h5ad"]  # archive removed
    assert len(server.requests) == 1

    server.shutdown()
    server.server_close()
    with caplog.at_level(logging.INFO, logger="gears_ddp"):
        assert dl.ensure_dataset("mini", tmp_path) == folder
    assert len(server.requests) == 1
    assert "found local copy" in caplog.text


def test_ensure_dataset_missing_expected_file(server, tmp_path, monkeypatch):
    monkeypatch.setitem(dl.DATASET_FILE_IDS, "mini", "wrong_zip")
    with pytest.raises(dl.DownloadError, match=r"extracted but .*mini/perturb_processed\.h5ad is missing"):
        dl.ensure_dataset("mini", tmp_path)
    assert not (tmp_path / "mini.zip").exists()


def test_ensure_dataset_rejects_zip_slip(server, tmp_path, monkeypatch):
    data_path = tmp_path / "data"
    monkeypatch.setitem(dl.DATASET_FILE_IDS, "mini", "slip_zip")
    with pytest.raises(dl.DownloadError, match=r"'\.\./evil\.txt' would escape"):
        dl.ensure_dataset("mini", data_path)
    assert _files(tmp_path) == ["data"]


@pytest.mark.parametrize(
    "route, match",
    [("abs_tar", "'/tmp/gears_ddp_evil.txt' would escape"), ("link_tar", "is a link or special file")],
)
def test_ensure_go_file_rejects_unsafe_tar(server, tmp_path, monkeypatch, route, match):
    monkeypatch.setitem(dl.GO_FILE_IDS, "go_essential_all", route)
    with pytest.raises(dl.DownloadError, match=match):
        dl.ensure_go_file("go_essential_all", tmp_path / "data")
    assert _files(tmp_path) == ["data"]
    assert not os.path.lexists("/tmp/gears_ddp_evil.txt")


def test_ensure_dataset_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*adamson, dixit, norman"):
        dl.ensure_dataset("nope", tmp_path)


def test_ensure_dataset_uses_local_copy_of_unlisted_name(tmp_path):
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "perturb_processed.h5ad").write_bytes(b"x")
    assert dl.ensure_dataset("custom", tmp_path) == tmp_path / "custom"


def _one_message_with_three_ways(message: str, *files) -> None:
    """A refusal's message: one line naming the missing files, then the mirror variable,
    a local archive and the folder."""
    assert "\n" not in message
    for path in files:
        assert str(path) in message
    assert dl.DATAVERSE_URL_ENV in message and "archive=" in message and "put " in message


def test_ensure_dataset_offline_explains_local_alternatives(closed_port_url, tmp_path):
    with pytest.raises(dl.DownloadError) as info:
        dl.ensure_dataset("norman", tmp_path)
    message = str(info.value)
    assert "could not reach" in message and closed_port_url + "6154020" in message
    _one_message_with_three_ways(message, tmp_path / "norman" / "perturb_processed.h5ad")
    assert "load(data_name='norman', archive='norman.zip')" in message
    assert f"put perturb_processed.h5ad in {tmp_path / 'norman'}/" in message and "load(data_path=...)" in message
    assert "gears_ddp.datasets.write_synthetic_dataset" in message
    assert _files(tmp_path) == []


def test_ensure_go_file_pickle(server, tmp_path, monkeypatch):
    monkeypatch.setitem(dl.GO_FILE_IDS, "gene2go_all.pkl", "pickle")
    path = dl.ensure_go_file("gene2go_all.pkl", tmp_path)
    assert path == tmp_path / "gene2go_all.pkl"
    assert pickle.loads(path.read_bytes()) == PICKLED


def test_ensure_go_file_rejects_html_error_page(server, tmp_path, monkeypatch):
    monkeypatch.setitem(dl.GO_FILE_IDS, "gene2go_all.pkl", "html")
    with pytest.raises(dl.DownloadError, match=rf"HTML page.*Missing: {re.escape(str(tmp_path / 'gene2go_all.pkl'))}"):
        dl.ensure_go_file("gene2go_all.pkl", tmp_path)
    assert _files(tmp_path) == []


def test_ensure_go_file_tar(server, tmp_path, monkeypatch):
    monkeypatch.setitem(dl.GO_FILE_IDS, "go_essential_all", "go_tar")
    path = dl.ensure_go_file("go_essential_all", tmp_path)
    assert path == tmp_path / "go_essential_all" / "go_essential_all.csv"
    assert path.read_bytes() == b"source,target\n"
    assert _files(tmp_path) == ["go_essential_all", "go_essential_all/go_essential_all.csv"]


def test_ensure_go_file_reuses_local_copy_without_network(closed_port_url, tmp_path, caplog):
    (tmp_path / "essential_all_data_pert_genes.pkl").write_bytes(pickle.dumps(["A", "B"]))
    with caplog.at_level(logging.INFO, logger="gears_ddp"):
        path = dl.ensure_go_file("essential_all_data_pert_genes.pkl", tmp_path)
    assert path == tmp_path / "essential_all_data_pert_genes.pkl"
    assert "found local copy" in caplog.text


def test_ensure_go_file_offline_explains_local_alternatives(closed_port_url, tmp_path):
    with pytest.raises(dl.DownloadError) as info:
        dl.ensure_go_file("go_essential_all", tmp_path)
    message = str(info.value)
    assert closed_port_url + "6934319" in message
    _one_message_with_three_ways(message, tmp_path / "go_essential_all" / "go_essential_all.csv")
    assert "go_archive=" in message and f"put them in {tmp_path}" in message and "--go-gene-sets" in message
    assert "write_synthetic_dataset" in message


def test_ensure_go_file_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="unknown GO file 'x.pkl'.*gene2go_all.pkl"):
        dl.ensure_go_file("x.pkl", tmp_path)


def test_a_downloaded_pickle_that_would_run_code_is_refused(server, tmp_path, monkeypatch):
    """Validating a download unpickles it as plain data only: a pickle whose ``__reduce__``
    would create a file is refused, and the file does not appear."""
    from test_safe_loading import Planted

    target = tmp_path / "created_by_download"
    monkeypatch.setitem(ROUTES, "planted", (200, OCTET, pickle.dumps(Planted(target)), None))
    with pytest.raises(dl.DownloadError, match=r"not a valid pickle file.*io\.open"):
        dl.download_file(_url("planted"), tmp_path / "g.pkl", "pickle")
    assert not target.exists() and not (tmp_path / "g.pkl").exists()


def test_every_missing_go_file_is_named_at_once(closed_port_url, tmp_path):
    names = ["gene2go_all.pkl", "essential_all_data_pert_genes.pkl", "go_essential_all"]
    with pytest.raises(dl.DownloadError) as info:
        dl.ensure_go_files(names, tmp_path)
    message = str(info.value)
    assert "3 Gene Ontology input file(s) are missing" in message
    for relative in ("gene2go_all.pkl", "essential_all_data_pert_genes.pkl", "go_essential_all/go_essential_all.csv"):
        assert str(tmp_path / relative) in message


# --------------------------------------------------------------------------- a server that refuses (403)


@pytest.fixture
def refusing(server, monkeypatch):
    """GEARS_DDP_DATAVERSE_URL pointing at a file API that answers 403 Forbidden to every request."""
    monkeypatch.setenv(dl.DATAVERSE_URL_ENV, f"http://127.0.0.1:{server.server_address[1]}{REFUSING_PREFIX}api")
    return server


GO_RELATIVE = ("gene2go_all.pkl", "essential_all_data_pert_genes.pkl", "go_essential_all/go_essential_all.csv")


def _archive(path, files: dict, kind: str):
    """Write ``files`` (name in the archive -> file on disk) as a zip or tar.gz at ``path``."""
    members = {name: Path(source).read_bytes() for name, source in files.items()}
    path.write_bytes(_zip_bytes(members) if kind == "zip" else _tar_gz_bytes(members))
    return path


def test_a_refused_dataset_and_go_files_get_one_message_each(refusing, tmp_path):
    from gears_ddp import PertData

    with pytest.raises(dl.DownloadError) as info:
        PertData(tmp_path).load(data_name="norman")
    message = str(info.value)
    assert "3 Gene Ontology input file(s) are missing" in message and message.count("HTTP status 403") == 3
    _one_message_with_three_ways(message, *(tmp_path / relative for relative in GO_RELATIVE))
    assert all(str(file_id) in message for file_id in dl.GO_FILE_IDS.values())
    with pytest.raises(dl.DownloadError) as info:
        dl.ensure_dataset("norman", tmp_path)
    assert "HTTP status 403 (Forbidden)" in str(info.value)
    _one_message_with_three_ways(str(info.value), tmp_path / "norman" / "perturb_processed.h5ad")
    assert _files(tmp_path) == []


def test_a_mirror_supplies_what_the_server_refuses(refusing, tmp_path, monkeypatch):
    with pytest.raises(dl.DownloadError, match="403"):
        dl.ensure_dataset("norman", tmp_path)
    monkeypatch.setitem(
        ROUTES,
        str(dl.DATASET_FILE_IDS["norman"]),
        (200, OCTET, _zip_bytes({"norman/perturb_processed.h5ad": b"h5ad bytes"}), None),
    )
    monkeypatch.setenv(dl.DATAVERSE_URL_ENV, f"http://127.0.0.1:{refusing.server_address[1]}/mirror/datafile")
    assert (dl.ensure_dataset("norman", tmp_path) / "perturb_processed.h5ad").read_bytes() == b"h5ad bytes"
    assert refusing.requests[-1] == f"/mirror/datafile/{dl.DATASET_FILE_IDS['norman']}"


@pytest.mark.parametrize("kind,with_folder", [("zip", True), ("tar", True), ("zip", False)])
def test_local_archives_supply_a_dataset_and_its_go_files_without_the_network(
    refusing, data_folder, tmp_path, kind, with_folder
):
    from gears_ddp import PertData

    prefix = "norman/" if with_folder else ""
    dataset = _archive(
        tmp_path / f"norman.{kind}",
        {f"{prefix}perturb_processed.h5ad": data_folder / "toy" / "perturb_processed.h5ad"},
        kind,
    )
    go = _archive(tmp_path / f"go.{kind}", {name: data_folder / name for name in GO_RELATIVE}, kind)
    pert_data = PertData(tmp_path / "data")
    pert_data.load(data_name="norman", archive=dataset, go_archive=go)
    reference = PertData(data_folder)
    reference.load(data_path=data_folder / "toy")
    assert pert_data.cells.conditions == reference.cells.conditions
    assert pert_data.cells.n_cells == reference.cells.n_cells
    assert refusing.requests == []
    assert dataset.exists() and go.exists()  # the user's archives are kept


def test_a_folder_supplies_what_the_server_refuses(refusing, data_folder, tmp_path):
    from gears_ddp import PertData

    data = tmp_path / "data"
    with pytest.raises(dl.DownloadError):
        PertData(data).load(data_name="norman")
    for relative in (*GO_RELATIVE, "toy/perturb_processed.h5ad"):
        target = data / relative.replace("toy/", "norman/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((data_folder / relative).read_bytes())
    requests = len(refusing.requests)
    pert_data = PertData(data)
    pert_data.load(data_name="norman")
    assert pert_data.cells.n_cells > 0 and len(refusing.requests) == requests


@pytest.mark.parametrize(
    "members,links,message",
    [
        ({"norman/perturb_processed.h5ad": b"x", "../evil.txt": b"pwned"}, {}, "would escape"),
        ({"norman/perturb_processed.h5ad": b"x", "/tmp/gears_ddp_evil.txt": b"pwned"}, {}, "would escape"),
        ({"norman/perturb_processed.h5ad": b"x"}, {"norman/splits": "/etc"}, "is a link"),
    ],
)
def test_an_unsafe_local_archive_is_refused_before_anything_is_written(tmp_path, members, links, message):
    archive = tmp_path / "norman.tar.gz"
    archive.write_bytes(_tar_gz_bytes(members, links))
    with pytest.raises(dl.DownloadError, match=message):
        dl.ensure_dataset("norman", tmp_path / "data", archive=archive)
    assert _files(tmp_path) == ["norman.tar.gz"]
    assert not os.path.lexists("/tmp/gears_ddp_evil.txt")


def test_a_zip_link_is_refused(tmp_path):
    info = zipfile.ZipInfo("norman/perturb_processed.h5ad")
    info.external_attr = 0o120777 << 16  # a symbolic link, as zip -y stores one
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(info, "/etc/passwd")
    (tmp_path / "norman.zip").write_bytes(buf.getvalue())
    with pytest.raises(dl.DownloadError, match="is a link"):
        dl.ensure_dataset("norman", tmp_path / "data", archive=tmp_path / "norman.zip")
    assert _files(tmp_path) == ["norman.zip"]


def test_a_local_archive_that_is_not_one_or_lacks_the_dataset_is_named(tmp_path):
    (tmp_path / "notes.zip").write_text("just text")
    with pytest.raises(ValueError, match=r"notes\.zip is neither a zip nor a tar archive"):
        dl.ensure_dataset("norman", tmp_path / "data", archive=tmp_path / "notes.zip")
    (tmp_path / "other.zip").write_bytes(_zip_bytes({"other/readme.txt": b"x"}))
    with pytest.raises(ValueError, match=r"holds neither norman/perturb_processed\.h5ad nor .* other/readme\.txt"):
        dl.ensure_dataset("norman", tmp_path / "data", archive=tmp_path / "other.zip")
    with pytest.raises(FileNotFoundError, match="absent.zip does not exist"):
        dl.ensure_dataset("norman", tmp_path / "data", archive=tmp_path / "absent.zip")
    with pytest.raises(ValueError, match="holds none of the GO files"):
        dl.ensure_go_files(["gene2go_all.pkl"], tmp_path / "data", archive=tmp_path / "other.zip")


def test_the_process_command_reports_a_refused_download_in_one_line(refusing, tmp_path, capsys):
    import toy_data
    from test_bad_input import _refused_in_one_line

    raw = tmp_path / "raw.h5ad"
    toy_data.make_raw().write_h5ad(raw)
    data = tmp_path / "data"
    _refused_in_one_line(
        capsys,
        ["process", "--adata", str(raw), "--data-path", str(data), "--name", "toy"],
        "403",
        str(data / "gene2go_all.pkl"),
        dl.DATAVERSE_URL_ENV,
        "go_archive=",
        "--go-gene-sets",
    )


def test_the_published_dataverse_download_keeps_a_local_copy_and_checks_a_download(server, tmp_path):
    """gears_ddp.utils.dataverse_download, as the published tutorials call it: a file already
    there is kept without a request; a download is checked to be what its name says."""
    from gears_ddp.utils import dataverse_download

    genes = tmp_path / "genes_with_hi_mean.npy"
    assert dataverse_download(_url("genes_npy"), genes) == genes
    assert np.load(genes, allow_pickle=True).tolist() == ["G0", "G1"]
    assert dataverse_download(_url("missing"), genes) == genes and len(server.requests) == 1  # the local copy
    with pytest.raises(dl.DownloadError, match="not a valid npy file"):
        dataverse_download(_url("pickle"), tmp_path / "other.npy")
    with pytest.raises(ValueError, match=r"name .*data.csv \*.zip, \*.tar.gz, \*.pkl or \*.npy"):
        dataverse_download(_url("pickle"), tmp_path / "data.csv")
