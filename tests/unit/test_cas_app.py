"""The CAS HTTP app in process: auth, errors as JSON, uploads checked against their address."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from piloop_common.cas import hash_bytes
from piloop_common.cas.local import LocalStore
from piloop_server.cas_app import create_cas_app

AUTH = {"authorization": "Bearer good"}


def client(tmp_path: Path) -> TestClient:
    return TestClient(create_cas_app(LocalStore(tmp_path), lambda t: t == "good"))


def test_a_token_is_required(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        for headers in ({}, {"authorization": "Bearer bad"}, {"authorization": "Basic good"}):
            r = c.get("/v1/cas/identity", headers=headers)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized" and r.json()["message"]


def test_put_checks_the_hash_and_get_streams_it_back(tmp_path: Path) -> None:
    address = hash_bytes(b"payload")
    with client(tmp_path) as c:
        r = c.put(f"/v1/cas/blobs/{address}", content=b"not the payload", headers=AUTH)
        assert r.status_code == 400 and r.json()["error"] == "bad_request"
        assert c.post("/v1/cas/has", json={"addresses": [address]}, headers=AUTH).json() == {"present": []}
        assert c.put(f"/v1/cas/blobs/{address}", content=b"payload", headers=AUTH).status_code == 201
        assert c.get(f"/v1/cas/blobs/{address}", headers=AUTH).content == b"payload"
        assert c.head(f"/v1/cas/blobs/{address}", headers=AUTH).headers["content-length"] == "7"
        assert c.post("/v1/cas/has", json={"addresses": [address]}, headers=AUTH).json() == {"present": [address]}


def test_errors_map_to_their_status(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        r = c.get(f"/v1/cas/blobs/{hash_bytes(b'absent')}", headers=AUTH)
        assert r.status_code == 404 and r.json()["error"] == "blob_missing"
        r = c.get("/v1/cas/blobs/sha256:..%2F..%2Fetc", headers=AUTH)
        assert r.status_code in (400, 404)
        r = c.post("/v1/cas/has", json={"addresses": ["md5:abc"]}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"] == "bad_address"
