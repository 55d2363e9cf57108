#!/bin/sh
# The compose stack's one-shot (service `minio-init`, image minio/mc): the bucket of piloop's CAS, and a
# MinIO user whose policy allows that bucket only. piloop (server and workers) signs in as that user,
# never as MinIO's root. Safe to run again: every step leaves what exists as it is, or sets it again.
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${PILOOP_S3_ACCESS_KEY_ID:?}" "${PILOOP_S3_SECRET_ACCESS_KEY:?}"
bucket="${PILOOP_BUCKET:-piloop}"

mc alias set stack http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "stack/$bucket"

policy=/tmp/piloop-cas-policy.json
cat >"$policy" <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow",
     "Action": ["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
     "Resource": ["arn:aws:s3:::$bucket"]},
    {"Effect": "Allow",
     "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts"],
     "Resource": ["arn:aws:s3:::$bucket/*"]}
  ]
}
JSON
mc admin policy create stack piloop-cas "$policy"
mc admin user add stack "$PILOOP_S3_ACCESS_KEY_ID" "$PILOOP_S3_SECRET_ACCESS_KEY"
# attaching twice is an error in mc; the user's info says whether it is attached already
if ! mc admin user info stack "$PILOOP_S3_ACCESS_KEY_ID" | grep -q piloop-cas; then
  mc admin policy attach stack piloop-cas --user "$PILOOP_S3_ACCESS_KEY_ID"
fi
echo "minio-init: bucket $bucket, user $PILOOP_S3_ACCESS_KEY_ID with policy piloop-cas"
