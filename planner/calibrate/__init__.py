"""Calibration: fit a profile and a cluster to measured runs (``hetplan calibrate``; docs/calibration.md).

    from hetplan.calibrate import calibrate_files
    result, (profile_path, cluster_path) = calibrate_files(profile, cluster, measurements, out_dir)

Modules, one job each: ``inputs`` (measured runs, checked and reduced), ``params`` (the parameters
and how values become a profile and a cluster), ``relevance`` (which parameters each run's
simulation reads), ``fit`` (least squares, identification),
``memory`` (reserves), ``calibration`` (the whole fit), ``write`` (the files), ``files`` (read, fit,
write), ``view`` (tables). None imports torch.
"""

from hetplan.calibrate.calibration import Calibration, ParamFit, RunFit, calibrate
from hetplan.calibrate.files import calibrate_files

__all__ = ["Calibration", "ParamFit", "RunFit", "calibrate", "calibrate_files"]
