"""specdec.attention_backend: PyTorch's cuDNN attention backend is turned off on a CUDA device, once,
and left alone elsewhere. The flag itself is PyTorch's; here its two functions are stand-ins, so the
test runs on a machine without a GPU (tests/test_device.py checks the real flag on one)."""
from __future__ import annotations

import logging

import torch

from specdec.attention_backend import avoid_cudnn_attention


def fake_flag(monkeypatch, enabled: bool) -> list[bool]:
    state = {"on": enabled}
    calls: list[bool] = []

    def enable(value: bool) -> None:
        calls.append(value)
        state["on"] = value
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: state["on"])
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", enable)
    return calls


def test_turned_off_on_a_cuda_device_once_with_a_log_line(monkeypatch, caplog):
    calls = fake_flag(monkeypatch, enabled=True)
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert avoid_cudnn_attention(torch.device("cuda")) is True
        assert avoid_cudnn_attention(torch.device("cuda:0")) is False     # already off: nothing more
    assert calls == [False]
    assert sum("cuDNN attention" in record.message for record in caplog.records) == 1


def test_left_alone_on_a_cpu(monkeypatch):
    calls = fake_flag(monkeypatch, enabled=True)
    assert avoid_cudnn_attention(torch.device("cpu")) is False
    assert calls == []


def test_the_config_key_keeps_it(monkeypatch):
    from specdec.config import load_spec_config
    assert load_spec_config("autoregressive").cudnn_attention is False
    assert load_spec_config("autoregressive", ["cudnn_attention=true"]).cudnn_attention is True
