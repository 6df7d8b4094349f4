"""Deployment settings from the environment and per-request options from vllm_xargs."""

from __future__ import annotations

import pytest

from draftgate.integrations.vllm.contract import DrafterName, SettingsError
from draftgate.integrations.vllm.inside.settings import ProposerSettings, RequestOptions


def test_defaults_and_env() -> None:
    s = ProposerSettings.from_env({}, k_max=8)
    assert (s.drafter, s.k, s.draft_url, s.prefetch, s.control_port) == (DrafterName.AUTO, None, None, True, 0)
    env = {
        "DRAFTGATE_VLLM_DRAFTER": "Remote",
        "DRAFTGATE_VLLM_K": "3",
        "DRAFTGATE_VLLM_DRAFT_URL": "http://127.0.0.1:8100/",
        "DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS": "20",
        "DRAFTGATE_VLLM_PREFETCH": "off",
        "DRAFTGATE_VLLM_CONTROL_PORT": "8199",
    }
    s = ProposerSettings.from_env(env, k_max=8)
    assert (s.drafter, s.k, s.draft_url, s.draft_timeout_s, s.prefetch, s.control_port) == (
        DrafterName.REMOTE,
        3,
        "http://127.0.0.1:8100",
        0.02,
        False,
        8199,
    )
    # a proposer class's own drafter wins over the variable
    assert (
        ProposerSettings.from_env({"DRAFTGATE_VLLM_DRAFTER": "ngram"}, 8, DrafterName.SUFFIX).drafter
        is DrafterName.SUFFIX
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DRAFTGATE_VLLM_DRAFTER": "eagle"}, "must be one of auto, suffix, ngram, remote"),
        ({"DRAFTGATE_VLLM_K": "9"}, "must be in [0, 8]"),
        ({"DRAFTGATE_VLLM_K": "many"}, "or 'auto'"),
        ({"DRAFTGATE_VLLM_DRAFTER": "remote"}, "needs DRAFTGATE_VLLM_DRAFT_URL"),
        ({"DRAFTGATE_VLLM_DRAFT_URL": "127.0.0.1:8100"}, "must start with http://"),
        ({"DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS": "0"}, "must be > 0"),
        ({"DRAFTGATE_VLLM_CONTROL_PORT": "x"}, "must be a port number"),
        ({"DRAFTGATE_VLLM_PREFETCH": "maybe"}, "1/true/on or 0/false/off"),
    ],
)
def test_bad_settings_say_what_to_do(env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsError, match=None) as e:
        ProposerSettings.from_env(env, k_max=8)
    assert says in str(e.value)


def test_request_options() -> None:
    assert RequestOptions.parse(None, 8) == RequestOptions()
    assert RequestOptions.parse({"other_plugin": 1}, 8) == RequestOptions()  # not ours: ignored
    o = RequestOptions.parse({"draftgate_speculate": 0, "draftgate_drafter": "ngram", "draftgate_k": "4"}, 8)
    assert (o.speculate, o.drafter, o.k) == (False, DrafterName.NGRAM, 4)
    for bad, says in [
        ({"draftgate_k": 9}, "must be in [0, 8]"),
        ({"draftgate_drafter": "x"}, "must be one of"),
        ({"draftgate_speculat": 0}, "unknown option 'draftgate_speculat'"),
    ]:
        with pytest.raises(SettingsError) as e:
            RequestOptions.parse(bad, 8)
        assert says in str(e.value)
