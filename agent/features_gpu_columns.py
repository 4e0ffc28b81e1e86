"""Feature schema 3's GPU column names (agent/features_gpu.py computes them): a module of its own so that
agent/features.py names every schema's columns without importing the builder that subclasses its own."""

NODE_FEATURES_GPU = (
    "has_gpu",  # the node has GPUs
    "gpu_count",  # GPUs / the cluster's most GPUs on a node
    "gpu_free_share",  # sum of per-GPU free milli-GPU / (1000 x count)
    "gpu_whole_free",  # GPUs with nothing on them / count
    "gpu_fit_left",  # after placing the pod: free share left on the GPU it takes (share) or whole free GPUs
    #                  left / count (whole GPUs); 0 where the pod asks no GPU or its GPUs do not fit
    "gpu_idle_watts",  # count x one GPU's idle watts / cluster max node peak incl. GPUs
    "gpu_peak_watts",  # count x one GPU's peak watts / the same
    "gpu_marginal_watts",  # GPU watts the pod adds (all GPUs' idle too when the node sleeps) / the same
    "gpu_model_ok",  # the node has GPUs of a model the pod allows (any model when it names none); 0: no GPU pod
    "pick_gpu_best_fit",  # 1 where gpu-best-fit (sleep-aware, headroom 1) would put the pod (ties: all)
)
POD_FEATURES_GPU = (
    "pod_gpu",  # GPUs asked / 8, <= 1
    "pod_gpu_milli",  # milli-GPU of each / 1000 (0 without GPUs)
    "pod_needs_gpu",
    "pod_gpu_constrained",  # the pod names allowed GPU models
)
CONTEXT_FEATURES_GPU = (
    "cluster_gpu_alloc",  # allocated milli-GPU / the cluster's milli-GPU (0 without GPUs)
    "cluster_gpu_whole_free",  # whole free GPUs / GPUs
    "frac_gpu_nodes",  # nodes with GPUs / nodes
)
