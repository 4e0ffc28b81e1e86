"""joulesched.agent: the policies that place pods, and the loop that runs them.

* :mod:`~joulesched.agent.policy`: the Policy and Scorer protocols (the seam);
* :mod:`~joulesched.agent.registry`: every policy by name, lazily, plus the ``joulesched.policies`` plugins;
* :mod:`~joulesched.agent.baselines`: kube-scheduler's scoring reproduced exactly
  (:mod:`~joulesched.agent.kube_scoring`), the packing, load- and power-aware heuristics;
* :mod:`~joulesched.agent.runner`: ``run_policy(backend, policy)``, the one loop for the twin and a cluster;
* :mod:`~joulesched.agent.lower_bound`: the offline energy bound no policy can beat;
* the DQN: :mod:`~joulesched.agent.config` (every knob), :mod:`~joulesched.agent.features`,
  :mod:`~joulesched.agent.dqn`, :mod:`~joulesched.agent.env` (Gymnasium), :mod:`~joulesched.agent.train`,
  :mod:`~joulesched.agent.checkpoint` (safetensors only) and :mod:`~joulesched.agent.dqn_policy`.
"""
