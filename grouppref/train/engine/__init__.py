"""What both trainers (the policy's and the reward model's) run alike: the accelerate loop,
its set-up, checkpoints and the metrics log, the processes of a launch, metric sums over them,
and the model folder's public parts."""
