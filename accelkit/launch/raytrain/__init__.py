"""`accelkit launch --ray ADDRESS`: an unmodified Accelerate script on the workers of a Ray Train job.

    job.py        LaunchRequest -> RayJob: what every worker runs (argv, environment, working folder) and the
                  job's shape (workers, resources, restarts, storage); pure, no Ray import
    rank_env.py   the environment Accelerate's own launcher would give each rank of the resolved config
    readiness.py  before any worker starts: the cluster reachable, enough CPUs/GPUs, the same torch/accelerate/
                  accelkit on every node, the working folder shared
    worker.py     runs inside each Ray Train worker: starts the rank as a child process, returns its status
    driver.py     connects, checks, runs the TorchTrainer, and turns its result into an exit status
"""

