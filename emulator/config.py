"""One emulated server's settings, resolved the way SGLang resolves its own defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from specroute.emulator.accept_schedule import AcceptChange
from specroute.emulator.acceptance import Acceptance
from specroute.emulator.adaptive import AdaptiveDepth, read_schedule, spec_graph_batch_sizes
from specroute.emulator.engine import Engine
from specroute.emulator.faults import Fault
from specroute.emulator.hardware import HardwareModel
from specroute.emulator.memory import default_fraction, token_capacity
from specroute.emulator.noise import NO_NOISE, Noise
from specroute.emulator.radix_cache import RadixCache

VERSION = "0.5.23"
SPEC_DEFAULT_MAX_RUNNING = 48  # SGLang's cap for EAGLE-family servers left unset


@dataclass(frozen=True)
class EmulatorConfig:
    mode: Literal["spec", "base"]
    hardware: HardwareModel
    acceptance: Acceptance
    host: str = "127.0.0.1"
    port: int = 30000
    time_scale: float = 1.0
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    max_queued_requests: int | None = None
    context_length: int = 131072
    decode_log_interval: int = 40
    stream_interval: int = 1  # SGLang's --stream-interval: decode tokens per streamed chunk
    health_timeout: float = 20.0
    seed: int = 0
    api_key: str | None = None  # as SGLang's --api-key: every path but probes needs it
    faults: tuple[Fault, ...] = ()  # injected from the start; /emulator/faults changes them
    noise: Noise = NO_NOISE  # run-to-run and step-to-step timing noise; off by default
    share_gpus: str | None = None  # a file naming GPUs shared with other servers (gpus.py)
    radix_cache_tokens: int = 0  # the radix cache's size in tokens; 0: no prefix caching
    enable_cache_report: bool = False  # SGLang's flag: cached tokens in the OpenAI usage
    enable_response_store: bool = False  # SGLang's flag: /v1/responses kept, and continued
    accept_schedule: tuple[AcceptChange, ...] = ()  # accept length changes in emulated time
    speculative_adaptive: bool = False  # SGLang's flag: the draft depth chosen per batch
    speculative_adaptive_config: str | None = None  # its schedule's file; None: the default
    skip_zero_step_draft_extend: bool = False  # SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND
    # SGLang's flag: the KV cache sized from the hardware model's memory; None: no limit
    # (0 for SGLang's own default fraction)
    mem_fraction_static: float | None = None
    memory_taken_gib: float = 0.0  # each GPU's, held by servers started before on its GPUs

    @property
    def speculative(self) -> bool:
        return self.mode == "spec"

    @property
    def effective_max_running(self) -> int:
        if self.max_running_requests is not None:
            return self.max_running_requests
        return SPEC_DEFAULT_MAX_RUNNING if self.speculative else self.hardware.max_running_requests

    @property
    def resolved_max_running(self) -> int | None:
        """The cap as SGLang's arguments resolve it (``/server_info``): a speculative server's
        default is set there; a plain server's stays None and its scheduler sizes it from
        memory (``effective_max_running``, in ``internal_states`` and ``/v1/loads``)."""
        if self.max_running_requests is not None or not self.speculative:
            return self.max_running_requests
        return SPEC_DEFAULT_MAX_RUNNING

    @property
    def effective_cuda_graph_max_bs(self) -> int:
        if self.cuda_graph_max_bs is not None:
            return self.cuda_graph_max_bs
        return min(self.hardware.cuda_graph_max_bs, self.effective_max_running)

    @property
    def adaptive(self) -> bool:
        """Adaptive speculation in force: asked for, on a speculative server (SGLang falls
        back to a fixed depth, with a warning, where it is unsupported)."""
        return self.speculative_adaptive and self.speculative

    def adaptive_refusal(self) -> str | None:
        """Why SGLang would turn ``--speculative-adaptive`` off here, in its words' sense."""
        if self.speculative_adaptive and not self.speculative:
            return "speculative_algorithm=None (only EAGLE/EAGLE3 are supported)"
        return None

    @property
    def resolved_mem_fraction(self) -> float | None:
        """The fraction of each GPU's free memory the server takes, as SGLang resolves it;
        None where the KV cache is no limit."""
        memory = self.hardware.memory
        if self.mem_fraction_static is None or memory is None:
            return None
        if self.mem_fraction_static > 0:
            return self.mem_fraction_static
        return default_fraction(memory.gpu_gib, self.tp_size, self.effective_cuda_graph_max_bs)

    @property
    def tp_size(self) -> int:
        return int(self.hardware.raw.get("tp_size", 1))

    @property
    def max_total_tokens(self) -> int | None:
        """The KV cache's size in tokens, from memory; None where it is no limit."""
        fraction, memory = self.resolved_mem_fraction, self.hardware.memory
        if fraction is None or memory is None:
            return None
        return token_capacity(
            memory, self.tp_size, fraction, self.speculative, self.memory_taken_gib
        )

    @property
    def model_path(self) -> str:
        return str(self.hardware.raw.get("model_path", self.hardware.name))

    def server_args(self) -> dict[str, Any]:
        spec = self.speculative
        steps = self.acceptance.steps
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_path,
            "host": self.host,
            "port": self.port,
            "tp_size": self.tp_size,
            "mem_fraction_static": self.resolved_mem_fraction,
            "dp_size": 1,
            "context_length": self.context_length,
            "max_running_requests": self.resolved_max_running,
            "max_queued_requests": self.max_queued_requests,
            "cuda_graph_max_bs": self.effective_cuda_graph_max_bs,
            "chunked_prefill_size": 8192,
            "random_seed": self.seed,
            "enable_metrics": True,
            "decode_log_interval": self.decode_log_interval,
            "stream_interval": self.stream_interval,
            "speculative_algorithm": "EAGLE3" if spec else None,
            "speculative_draft_model_path": self.hardware.raw.get("draft_model_path")
            if spec
            else None,
            "speculative_num_steps": steps if spec else None,
            "speculative_eagle_topk": 1 if spec else None,
            "speculative_num_draft_tokens": steps + 1 if spec else None,
            "speculative_adaptive": self.adaptive,
            "speculative_adaptive_config": self.speculative_adaptive_config,
            "disable_radix_cache": self.radix_cache_tokens == 0,
            "enable_cache_report": self.enable_cache_report,
            "enable_response_store": self.enable_response_store,
            # SGLang 0.5.23 lists every argument, its keys and the command line as given
            "api_key": self.api_key,
            "admin_api_key": None,
            "launch_command": self.launch_command(),
        }

    def launch_command(self) -> str:
        """The command line SGLang would have been started with, as its ``/server_info``
        shows it (keys included: SGLang does not hide them)."""
        words = ["python3 -m sglang.launch_server", f"--model-path {self.model_path}"]
        words += [f"--host {self.host}", f"--port {self.port}"]
        if self.speculative:
            words.append("--speculative-algorithm EAGLE3")
        if self.speculative_adaptive:
            words.append("--speculative-adaptive")
        if self.speculative_adaptive_config is not None:
            words.append(f"--speculative-adaptive-config {self.speculative_adaptive_config}")
        if self.api_key is not None:
            words.append(f"--api-key {self.api_key}")
        return " ".join(words)

    def engine(self) -> Engine:
        return Engine(
            self.hardware,
            speculative=self.speculative,
            steps=self.acceptance.steps,
            acceptance=self.acceptance,
            max_running_requests=self.effective_max_running,
            cuda_graph_max_bs=self.effective_cuda_graph_max_bs,
            seed=self.seed,
            noise=self.noise,
            cache=RadixCache(self.radix_cache_tokens) if self.radix_cache_tokens else None,
            adaptive=self._adaptive_depth(),
            skip_zero_extend=self.skip_zero_step_draft_extend,
            max_total_tokens=self.max_total_tokens,
        )

    def _adaptive_depth(self) -> AdaptiveDepth | None:
        if not self.adaptive:
            return None
        schedule = read_schedule(self.speculative_adaptive_config)
        graphs = spec_graph_batch_sizes(self.effective_cuda_graph_max_bs)
        return AdaptiveDepth(self.acceptance.steps, schedule, graphs)
