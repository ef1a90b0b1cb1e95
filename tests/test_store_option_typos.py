"""A misspelt S3 option of a plain s3:// URL is refused as the store is made, naming the
closest option taken: it was accepted, and failed at the first request as a StoreError
("AioSession.__init__() got an unexpected keyword argument 'endpoint'")."""

from __future__ import annotations

import pytest

from ckpt_nb import FsspecStore

pytest.importorskip("s3fs")


@pytest.mark.parametrize(("options", "said"), [
    ({"endpoint": "http://127.0.0.1:9"}, "did you mean endpoint_url=?"),
    ({"client_kwargs": {"endpoint": "http://127.0.0.1:9"}},
     "client_kwargs has 'endpoint', which botocore's create_client does not take: "
     "did you mean endpoint_url?"),
    ({"config_kwargs": {"read_timeot": 3}},
     "config_kwargs has 'read_timeot', which botocore's Config does not take: "
     "did you mean read_timeout?"),
])
def test_a_misspelt_option_of_a_plain_s3_url_is_refused(options: dict[str, object],
                                                        said: str) -> None:
    with pytest.raises(TypeError, match="s3://bucket/x: .*" + said.replace("?", r"\?")):
        FsspecStore("s3://bucket/x", **options)


def test_an_option_of_no_close_name_is_refused_without_a_chains_advice() -> None:
    with pytest.raises(TypeError) as refused:
        FsspecStore("s3://bucket/x", colour="red")
    assert str(refused.value) == "s3://bucket/x: its file system (s3) takes no option 'colour'"


def test_options_spelt_right_are_taken() -> None:
    store = FsspecStore("s3://bucket/x", endpoint_url="http://127.0.0.1:9", anon=False,
                        client_kwargs={"region_name": "us-east-1"},
                        config_kwargs={"read_timeout": 3, "retries": {"max_attempts": 2}})
    assert store.url == "s3://bucket/x"
    # (aiobotocore's AioConfig, which s3fs makes, takes more than botocore's Config: a
    # MinIO server's own CA goes in connector_args, and was refused)
    FsspecStore("s3://bucket/x", endpoint_url="http://127.0.0.1:9",
                config_kwargs={"connector_args": {"keepalive_timeout": 12},
                               "tcp_keepalive": True})
