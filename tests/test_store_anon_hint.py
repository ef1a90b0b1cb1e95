"""A 403 of a store opened with anon=True says so: its hint told the user to check the
AWS credentials' environment variables, which anon=True sends none of."""

from __future__ import annotations

import pytest

from ckpt_nb import FsspecStore

pytest.importorskip("s3fs")


def test_a_refusal_of_an_anonymous_store_says_it_was_opened_anonymously() -> None:
    refusal = PermissionError("Forbidden")  # (s3fs's error for S3's 403)
    anonymous = FsspecStore("s3://bucket/exp", endpoint_url="http://127.0.0.1:9", anon=True)
    for writing in (False, True):  # (a save to a public bucket: its PutObject refused)
        said = anonymous._hint(refusal, writing=writing)
        assert "opened anonymously, anon=True" in said and "drop anon=True" in said, said
        assert "AWS_ACCESS_KEY_ID" not in said and "credentials given" not in said, said
    signed = FsspecStore("s3://bucket/exp", endpoint_url="http://127.0.0.1:9")
    assert "AWS_ACCESS_KEY_ID" in signed._hint(refusal)
