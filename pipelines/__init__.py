"""joulesched.pipelines: runs, from one benchmark cell to a whole pipeline, and the `joulesched` CLI.

* runs: :mod:`.benchmark` (every policy side by side), :mod:`.sweep`, :mod:`.training` (train and evaluate),
  :mod:`.sim_pipeline` and :mod:`.kube_pipeline` (the whole job on the twin or a cluster), :mod:`.host_steps`
  (over SSH), :mod:`.explain`, :mod:`.report` (HTML with plots), :mod:`.stages` (resumable steps);
* shared: :mod:`.progress` (the one progress display), :mod:`.suite` (the shipped scenarios and model);
* :mod:`.cli`: thin typer commands over all of the above.
"""
