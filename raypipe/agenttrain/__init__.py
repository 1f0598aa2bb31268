"""Teaching the embedded agent to search: the dev split, supervised trajectories in the agent's own protocol,
and its LoRA fine-tuning (docs/agent-training.md). Ray-free; ``raypipe.stages.agent_data`` and
``raypipe.stages.tune_agent`` give it Ray."""
