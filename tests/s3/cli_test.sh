#!/usr/bin/env bash
# The kvsnap command on a store whose blobs are in the bed's bucket (store.json: s3://BUCKET/PREFIX,
# credentials and endpoint from AWS_* as a user sets them): save, ls, restore byte for byte,
# verify, doctor, rm, gc. Run inside tests/beds/swift-s3.sh run (it exports S3_*).
#   cli_test.sh KVSNAP FIXTURES_DIR
set -euo pipefail
k=$1 fixtures=$2
: "${S3_ENDPOINT:?run inside tests/beds/swift-s3.sh run}"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY AWS_ENDPOINT_URL=$S3_ENDPOINT
fail() { echo "cli_test: $*" >&2; exit 1; }

# The bucket, made through Swift's own API (tempauth token): kvsnap does not create buckets.
token=$(curl -s -f -o /dev/null -D - --noproxy '*' -H 'X-Auth-User: test:tester' -H 'X-Auth-Key: testing' \
  "$S3_ENDPOINT/auth/v1.0" | tr -d '\r' | sed -n 's/^[Xx]-[Aa]uth-[Tt]oken: //p')
curl -s -f --noproxy '*' -X PUT -H "X-Auth-Token: $token" "$S3_ENDPOINT/v1/AUTH_test/kvsnap-cli"

echo '{"blobs": "s3://kvsnap-cli/team-a"}' >"$d/store.json"
f=$fixtures/v0.5.0/hd64-f16-f16-faon.slot
"$k" save --store "$d" "$f" --name one
"$k" ls --store "$d" | grep '^1 *one' >/dev/null || fail "ls does not show the snapshot"
"$k" restore --store "$d" one -o "$d/back.slot"
cmp "$d/back.slot" "$f" || fail "the restored file differs"
"$k" verify --store "$d" --all
"$k" doctor --store "$d" | grep "ok    blobs: s3://kvsnap-cli/team-a at $S3_ENDPOINT" >/dev/null || fail "doctor does not name the bucket"
ls "$d/s3-cache" | grep . >/dev/null || fail "the restore left nothing in the read-through cache"
"$k" rm --store "$d" one
"$k" gc --store "$d"
# What the bucket holds now: nothing under the prefix but the store's id (Swift's API: the container).
left=$(curl -s -f --noproxy '*' -H "X-Auth-Token: $token" "$S3_ENDPOINT/v1/AUTH_test/kvsnap-cli?prefix=team-a/")
[ "$left" = "team-a/store-id" ] || fail "objects left in the bucket after rm + gc: $left"
# A wrong secret: a clear error naming the bucket, exit non-zero, the secret never printed.
if out=$(AWS_SECRET_ACCESS_KEY=not-the-secret-42 "$k" ls --store "$d" 2>&1); then fail "a wrong secret was accepted"; fi
grep -q "SignatureDoesNotMatch" <<<"$out" || fail "no S3 error code in: $out"
! grep -q "not-the-secret-42" <<<"$out" || fail "the secret is printed: $out"
echo "cli_test: ok"
