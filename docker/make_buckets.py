"""Create S3 buckets (the tests' stack: SeaweedFS, where MinIO's `mc` is not at hand).

python make_buckets.py BUCKET...   # $S3_ACCESS_KEY, $S3_SECRET_KEY; endpoint http://s3:9000
"""

from __future__ import annotations

import os
import sys
import time

import s3fs


def main(buckets: list[str]) -> None:
    fs = s3fs.S3FileSystem(
        endpoint_url=os.environ.get("S3_ENDPOINT_URL", "http://s3:9000"),
        key=os.environ["S3_ACCESS_KEY"],
        secret=os.environ["S3_SECRET_KEY"],
    )
    deadline = time.monotonic() + 60
    for bucket in buckets:
        while True:
            try:
                if not fs.exists(bucket):
                    fs.mkdir(bucket)
                break
            except Exception as error:  # S3 answers before it accepts buckets
                if time.monotonic() > deadline:
                    sys.exit(f"make_buckets: cannot create {bucket}: {error}")
                time.sleep(1)
            fs.invalidate_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
