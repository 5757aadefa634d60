"""The agent's access rules hold for the OpenAI-compatible front end: API keys as
``Authorization: Bearer`` (401 in OpenAI's shape without one), the shared rate limit (429 with
Retry-After), and the Unix socket serves it like the port."""

from __future__ import annotations

from pathlib import Path

import httpx
import httpx2
import openai
import pytest

from tests.agent.openai.conftest import MODEL
from tests.agent.server import serve

KEY = "s3cret-key-for-tests"


def test_without_a_valid_bearer_key_the_client_gets_401(lm_repository: Path) -> None:
    with serve(lm_repository, api_key=KEY, rate_limit_per_s=0.01, rate_limit_burst=3) as agent:
        with openai.OpenAI(base_url=f"{agent.url}/v1", api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError) as refused:
                bad.models.list()
        assert refused.value.body["type"] == "authentication_error"  # type: ignore[index]
        assert refused.value.response.headers["www-authenticate"].startswith("Bearer")
        plain = httpx.post(f"{agent.url}/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert plain.status_code == 401 and plain.json()["error"]["code"] == "unauthorized"
        with openai.OpenAI(base_url=f"{agent.url}/v1", api_key=KEY, max_retries=0) as good:
            out = good.completions.create(model=MODEL, prompt="edge", max_tokens=2)
            assert out.usage is not None and out.usage.completion_tokens == 2
            good.models.list()
            # the burst of 3 is spent by the two calls above and the first below (the 401s
            # were turned away before the rate limit)
            with pytest.raises(openai.RateLimitError) as limited:
                good.models.list()
                good.models.list()
        assert int(limited.value.response.headers["retry-after"]) >= 1
        assert limited.value.body["code"] == "rate_limited"  # type: ignore[index]


def test_the_unix_socket_serves_the_openai_api(lm_repository: Path, tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    with serve(lm_repository, uds=sock):
        transport = httpx2.HTTPTransport(uds=str(sock))
        with (
            httpx2.Client(transport=transport) as http,
            openai.OpenAI(base_url="http://agent/v1", api_key="unused", http_client=http) as client,
        ):
            out = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                temperature=0,
            )
            assert out.choices[0].message.content
            with client.completions.create(
                model=MODEL, prompt="a", max_tokens=4, stream=True
            ) as stream:
                assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].text) >= 1


def test_tf_serving_paths_under_v1_keep_their_error_shape(lm_repository: Path) -> None:
    with serve(lm_repository, api_key=KEY) as agent:
        tf = httpx.post(f"{agent.url}/v1/models/mlp:predict", json={"instances": [[0.0] * 256]})
        assert tf.status_code == 401 and isinstance(tf.json()["error"], str)
        ours = httpx.post(f"{agent.url}/v1/chat/completions", json={})
        assert ours.status_code == 401 and ours.json()["error"]["type"] == "authentication_error"
