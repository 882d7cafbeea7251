"""The Complementary RL training harness: rollouts, model backends, experience, trainer, eval, CLI."""
