"""The core of the app: typed configs and the job hash (`schema`), job directories and results (`results`), the task
declarations (`tasks`), preset expansion (`sweeps`), conf resolvers, wandb logging. It never imports task code
(training.tasks) or the command line (training.cli): scripts hash and read results with it alone."""
