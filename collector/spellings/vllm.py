"""Inference servers' latency histograms: vLLM, SGLang, TGI, and Triton's summaries.

vLLM's names, labels (``model_name``, ``engine``) and bucket edges are upstream's
(``vllm/v1/metrics/loggers.py``).  Request phases are kept apart (time to first token,
inter-token, end to end): mixing prefill into per-token latency skews it.
"""

from __future__ import annotations

from dataclasses import dataclass

# fmt: off
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                               2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
#: Training step times: a generic histogram (the simulator's jobs expose it).
STEP_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0,
                30.0, 60.0)
# fmt: on


@dataclass(frozen=True)
class Histogram:
    name: str
    phase: str
    help: str
    buckets: tuple[float, ...]


VLLM = (
    Histogram("vllm:e2e_request_latency_seconds", "e2e",
              "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
    Histogram("vllm:time_to_first_token_seconds", "ttft",
              "Histogram of time to first token in seconds.", TIME_TO_FIRST_TOKEN_BUCKETS),
    Histogram("vllm:inter_token_latency_seconds", "inter_token",
              "Histogram of inter token latency in seconds.", INTER_TOKEN_LATENCY_BUCKETS),
)  # fmt: skip
#: Older vLLM exported inter-token latency under this name.
VLLM_ALIASES = {"vllm:time_per_output_token_seconds": "inter_token"}
VLLM_LABELS = ("model_name", "engine")
VLLM_SUCCESS = "vllm:request_success_total"

SGLANG = (
    Histogram("sglang:e2e_request_latency_seconds", "e2e", "", REQUEST_LATENCY_BUCKETS),
    Histogram("sglang:time_to_first_token_seconds", "ttft", "", TIME_TO_FIRST_TOKEN_BUCKETS),
    Histogram("sglang:inter_token_latency_seconds", "inter_token", "",
              INTER_TOKEN_LATENCY_BUCKETS),
    Histogram("sglang:time_per_output_token_seconds", "inter_token", "",
              INTER_TOKEN_LATENCY_BUCKETS),
)  # fmt: skip
TGI = (
    Histogram("tgi_request_duration", "e2e", "", REQUEST_LATENCY_BUCKETS),
    Histogram("tgi_request_mean_time_per_token_duration", "inter_token", "",
              INTER_TOKEN_LATENCY_BUCKETS),
)  # fmt: skip
TRAINING = (
    Histogram("training_step_duration_seconds", "step", "Training step wall time in seconds.",
              STEP_BUCKETS),
)  # fmt: skip
#: Triton's opt-in latency summaries (microseconds, with their own quantiles).
TRITON_SUMMARIES = {"nv_inference_request_summary_us": "e2e"}

#: Histogram family name -> request phase, for every server hbmwatch reads.
PHASE_OF: dict[str, str] = {
    **{h.name: h.phase for h in (*VLLM, *SGLANG, *TGI, *TRAINING)},
    **VLLM_ALIASES,
}
#: Labels carrying the model's name, by server.
MODEL_LABELS = ("model_name", "model")
