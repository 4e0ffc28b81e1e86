"""joulesched infrastructure: the Pulumi program (cluster, kvm, aws targets) and the libvirt code under it."""
