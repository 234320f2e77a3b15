"""Cluster targets: one typed cluster job (cluster_job.ClusterJob, made once from the launch request and the job's
shape), rendered for each scheduler. No renderer re-derives the job's values (nodes, processes per node, GPUs, port,
the request every node runs); each only spells them in its scheduler's format.

- cluster_job.py   ClusterJob: the request for all nodes, its shape checked and its config resolved once;
                   JobOptions: what every target is asked (nodes, GPUs per node, name, stall timeout);
                   write_cluster_job: refuse what cannot be written, then write the job file (and its config beside);
- node_command.py  the one per-node command every target runs (accelkit.launch.cluster.node, which is what
                   `accelkit launch --machine-rank R` runs on a bare machine), with the scheduler's variables;
- slurm.py         the sbatch script (its batch step: accelkit.launch.cluster.slurm_job);
- skypilot.py      a SkyPilot task (num_nodes, resources.accelerators, setup, run);
- kubernetes.py    a Kubeflow Trainer TrainJob (runtimeRef torch-distributed);
- accelerators.py  the accelerator names SkyPilot knows;
- job_key.py       the job board's key (SkyPilot's --secret, a Kubernetes Secret): made at submission, never in
                   the job file;
- node_resources.py  NodeResources: CPUs and memory per node, and the ceilings no scheduler grants past (nodes,
                   GPUs, CPUs, memory);
- storage.py       storage every node shares (--storage), and the refusal of a sharded checkpoint scattered over the
                   nodes' own disks.
"""
