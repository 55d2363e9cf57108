#!/opt/python/bin/python3
"""The part of MinIO's `mc` that docker-compose.yml and deploy/minio-init.sh call, against moto's server (boto3):
`mc ready local`, `mc alias set`, `mc mb --ignore-existing`, `mc admin policy create|attach`, `mc admin user
add|info`. The user and policy are made in the endpoint's IAM as minio-init.sh asks; moto does not check
credentials against them (docs/compose.md says so)."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

ALIASES = Path(os.environ.get("MC_CONFIG_DIR", "/tmp/.mc")) / "aliases.json"


def fail(msg: str) -> int:
    print(f"mc: {msg}", file=sys.stderr)
    return 1


def client(alias: str, service: str):  # type: ignore[no-untyped-def]
    import boto3

    a = json.loads(ALIASES.read_text())[alias]
    return boto3.client(
        service,
        endpoint_url=a["url"],
        aws_access_key_id=a["key"],
        aws_secret_access_key=a["secret"],
        region_name="us-east-1",
    )


def ready() -> int:
    if not Path("/tmp/minio-ready").exists():
        return fail("not ready: the server has not replayed its state yet")
    try:
        urllib.request.urlopen("http://127.0.0.1:9000/moto-api/", timeout=3).read()
    except OSError as e:
        return fail(f"not ready: {e}")
    print("The cluster is ready")
    return 0


def main(argv: list[str]) -> int:
    if argv[:2] == ["ready", "local"]:
        return ready()
    if argv[:2] == ["alias", "set"] and len(argv) == 6:
        ALIASES.parent.mkdir(parents=True, exist_ok=True)
        have = json.loads(ALIASES.read_text()) if ALIASES.exists() else {}
        have[argv[2]] = {"url": argv[3], "key": argv[4], "secret": argv[5]}
        ALIASES.write_text(json.dumps(have))
        return 0
    if argv[:1] == ["mb"]:
        target = next(a for a in argv[1:] if not a.startswith("--"))
        alias, _, bucket = target.partition("/")
        s3 = client(alias, "s3")
        if bucket in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
            if "--ignore-existing" in argv:
                print(f"Bucket created successfully `{target}`.")
                return 0
            return fail(f"bucket {bucket} exists")
        s3.create_bucket(Bucket=bucket)
        print(f"Bucket created successfully `{target}`.")
        return 0
    if argv[:3] == ["admin", "policy", "create"] and len(argv) == 6:
        iam = client(argv[3], "iam")
        doc = Path(argv[5]).read_text()
        arn = f"arn:aws:iam::123456789012:policy/{argv[4]}"
        try:
            iam.get_policy(PolicyArn=arn)
        except iam.exceptions.NoSuchEntityException:
            iam.create_policy(PolicyName=argv[4], PolicyDocument=doc)
        return 0
    if argv[:3] == ["admin", "user", "add"] and len(argv) == 6:
        iam = client(argv[3], "iam")
        try:
            iam.get_user(UserName=argv[4])
        except iam.exceptions.NoSuchEntityException:
            iam.create_user(UserName=argv[4])
        return 0
    if argv[:3] == ["admin", "user", "info"] and len(argv) == 5:
        iam = client(argv[3], "iam")
        names = [p["PolicyName"] for p in iam.list_attached_user_policies(UserName=argv[4])["AttachedPolicies"]]
        print(f"AccessKey: {argv[4]}\nStatus: enabled\nPolicyName: {','.join(names)}")
        return 0
    if argv[:3] == ["admin", "policy", "attach"] and len(argv) == 7 and argv[5] == "--user":
        iam = client(argv[3], "iam")
        iam.attach_user_policy(UserName=argv[6], PolicyArn=f"arn:aws:iam::123456789012:policy/{argv[4]}")
        return 0
    return fail(f"this stand-in for MinIO's mc does not know `mc {' '.join(argv)}`")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
