"""joulesched.infra: environments to run on, and the hosts in them.

The Pulumi program (:mod:`.program`: an existing cluster, libvirt/KVM guests, EC2) with its config
(:mod:`.config`) and Automation API wrapper (:mod:`.stack`); libvirt guests without Pulumi
(:mod:`.libvirt_guests`, :mod:`.kvm`); cloud-init templates (:mod:`.cloudinit`); Ansible provisioning
(:mod:`.provision`) and its air-gapped wheelhouse (:mod:`.wheelhouse`); SSH to hosts with pinned keys and
Ansible inventories (:mod:`.remote`).
"""
