#!/usr/bin/env bash
# What ctest's s3.swift runs inside one bed (tests/beds/swift-s3.sh run): the gtest binary, then
# the kvsnap command on a store whose blobs are in the bucket.
#   suite.sh S3_TESTS KVSNAP FIXTURES_DIR
set -euo pipefail
"$1"
bash "$(dirname "$0")/cli_test.sh" "$2" "$3"
