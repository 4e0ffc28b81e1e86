"""`python -m workloads serve cpu ...`: the same `workload` commands without the full joulesched CLI.

Container images use this: it needs only the workload dependencies, not torch and the rest.
"""

from workloads.cli import workload_app

if __name__ == "__main__":
    workload_app(prog_name="python -m workloads")
