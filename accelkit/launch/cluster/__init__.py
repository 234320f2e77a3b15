"""launch's cluster side: what runs on each node of a multi-machine job, and the job files that start them.

- node.py            one node of a job: the cross-node preflight, then the same supervised launch as one machine
                     (launch.supervised.run_supervised), with heartbeats and save-signal forwarding beside it;
- slurm_job.py       the batch step of an sbatch script: machine 0's address and port, the job board, srun;
- job_board.py       the small key-value store the nodes of one job share (hosted by machine 0);
- node_preflight.py  every node about to run the same thing (script, versions, request) before any rank starts;
- network.py         the interface on this machine's route to machine 0 (GLOO/NCCL/TP_SOCKET_IFNAME);
- network_checks.py  a loopback machine-0 address, an unreachable port, an unshared working directory: refused;
- heartbeat.py       each node's beat on the board; machine 0 names a machine that falls silent;
- slurm_values.py    the values of `#SBATCH` lines, checked and spelled as sbatch reads them;
- targets/           the job files: SLURM, SkyPilot and Kubernetes renderings of one ClusterJob.

Nothing outside accelkit.launch imports these modules: the launch package's face exports what others need.
"""
