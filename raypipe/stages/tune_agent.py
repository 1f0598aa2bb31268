"""The tune-agent job (``raypipe tune-agent``, ``python jobs/tune_agent.py``): the agent's fine-tune on Ray Train.

The steps are Ray-free (:class:`raypipe.agenttrain.tune.AgentTuning`); here Ray Train runs them on
``agent_train.num_workers`` data-parallel workers (CPU workers, or one GPU each with ``agent_train.use_gpu``:
the same command), :func:`raypipe.runtime.trainer.run_training` wiring seed, resume and checkpoints. A rerun
after an interruption starts from the last checkpoint in OUT/ray_train (a local storage path); the artifact
(OUT/artifact: the adapter, LoRA factors or weight deltas, and its manifest) is written from the final
checkpoint.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from functools import partial
from pathlib import Path

from raypipe.agenttrain.trajectories import TRAJECTORIES_FILE
from raypipe.agenttrain.tune import AgentTuning, latest_checkpoint, loop_config, write_artifact
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.machine import cpu_description
from raypipe.core.models import locate_llm, resolve_llm
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.trainer import is_uri, run_training, storage_location, torch_trainer

DESCRIPTION = """Fine-tune the agent (engine.model) on agent-data trajectories with Ray Train (docs/agent-training.md).

LoRA (or full fine-tuning: agent_train.method=full) on the agent's own tokens (agent_train.*), seeded, resumable
from its last checkpoint; writes OUT/artifact (adapter.safetensors, manifest.json), applied at model conversion
with --set engine.adapter=OUT/artifact.
"""

log = logging.getLogger(__name__)


def train_loop_per_worker(config: dict) -> None:
    run_training(partial(AgentTuning, config), seed=config["seed"], threads=config["threads"])


def main(argv: list[str] | None = None) -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("data", metavar="DATA_DIR", help="an agent-data output folder (trajectories.jsonl)")
    parser.add_argument("out", metavar="OUT", help="the output folder (Ray Train's runs and the artifact)")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    config = config_from_args(args)
    data = Path(args.data) / TRAJECTORIES_FILE
    if not data.exists():
        raise SystemExit(f"error: {data} not found: make it with `raypipe agent-data`")
    if config.engine.adapter is not None:  # the embedded default's own artifact, which this command remakes
        log.info(
            "training from the base model %s; engine.adapter (%s) is not applied",
            config.engine.model,
            config.engine.adapter,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started, cpu_before = time.monotonic(), os.times()
    source, model_path = locate_llm(config.engine.model), resolve_llm(config.engine.model)
    cfg = config.agent_train
    storage = storage_location(config.ray.storage_path, out, "ray_train")
    resume = None if is_uri(storage) else latest_checkpoint(Path(storage))
    if resume is not None:
        log.info("resuming from %s", resume)
    init_ray(config)
    import ray

    try:
        trainer = torch_trainer(
            train_loop_per_worker,
            loop_config(cfg, model_path, data, config.seed, resume),
            name=f"tune-agent-{time.strftime('%Y%m%d-%H%M%S')}",
            storage=storage,
            num_workers=cfg.num_workers,
            use_gpu=cfg.use_gpu,
            cpus_per_worker=cfg.cpus_per_worker,
            keep=2,
        )
        result = trainer.fit()
    finally:
        ray.shutdown()
    cpu_after = os.times()
    cpu = sum(cpu_after[i] - cpu_before[i] for i in range(4))  # this process and its children (a local Ray)
    with result.checkpoint.as_directory() as folder:
        model, flags, cores = cpu_description()
        taken = {
            "wall_s": time.monotonic() - started,
            "cpu_s": cpu,
            "cpu_count": cores,
            "cpu_model": model,
            "cpu_flags": flags,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        manifest = write_artifact(
            out / "artifact", Path(folder), loop_config(cfg, model_path, data, config.seed), source, taken
        )
    print(
        f"{manifest['steps']} steps on {len(manifest['question_ids'])} trajectories, {manifest['tokens']} tokens, "
        f"{manifest['wall_s']:.0f} s on {manifest['cpu_count']} cores of {manifest['cpu_model']} "
        f"({manifest['cpu_flags']}); artifact {out / 'artifact'} ({manifest['adapter_bytes'] / 1e6:.1f} MB)"
    )
