"""joulesched.power: watts and joules, from curves, hardware counters and Prometheus.

* :mod:`~joulesched.power.meter`: the EnergyMeter and PowerMeter protocols (the seam);
* host meters: RAPL through :mod:`~joulesched.power.powercap` and :mod:`~joulesched.power.msr`, the calibrated
  :mod:`~joulesched.power.model`, chosen by :mod:`~joulesched.power.meters`;
* :mod:`~joulesched.power.prometheus`: energy read back as ``increase()`` of ``*_joules_total``;
* :mod:`~joulesched.power.curves`: SPECpower curves; :mod:`~joulesched.power.calibrate` measures a node's;
* :mod:`~joulesched.power.monitor` and :mod:`~joulesched.power.exporter`: Kepler-style attribution to
  processes, pods and VMs, served to Prometheus.
"""
