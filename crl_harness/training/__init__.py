"""The training loop and its parts.

- ``trainer``: ``Trainer``, the loop of Complementary RL (rollouts, credit, distillation, the
  actor's and the extractor's updates, checkpoints), top to bottom.
- ``losses``: the actor's GRPO and the extractor's CISPO losses, each a few named tensors.
- ``sampler``: ``TaskSampler``, which env and seed each group of a step gets (mixture weights).
- ``learner``: ``PolicyLearner``, differentiable log-probs of generated tokens and one optimiser
  update of a causal LM from a loss function (the actor's GRPO, the extractor's CISPO).
- ``packing``: ``pack_turns``, a multi-turn trajectory as one row (observations masked out) when
  its prompts only grow, else one row per turn.
- ``batches``: a step's trajectories as the actor's training rows.
- ``checkpoint``: atomic checkpoints (models, optimisers, bank, RNG states, step), what the
  trainer writes in them, and resume.
- ``step_metrics``: what one training step logs (success, pairs, updates, bank, gate, asks).
- ``metrics``: per-step metrics to JSONL and TensorBoard, and the learning-curve plot.
"""
