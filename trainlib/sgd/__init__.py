"""RaySGD's ``PyTorchTrainer`` on a Dask cluster: creators, then ``train()`` call by call.

Port by changing imports: ``ray.util.sgd`` -> ``trainlib.sgd`` (see
docs/porting-from-raysgd.md). The ranks are started once by trainlib's engine (the same
supervisors, rank processes, failure detection and checkpoint storage as ``TorchTrainer``)
and each call is a command to the formed group.
"""

from trainlib.sgd.functions import train_epoch, validate_epoch
from trainlib.sgd.precision import MixedPrecision, get_mixed_precision
from trainlib.sgd.trainable import PyTorchTrainable
from trainlib.sgd.trainer import PyTorchTrainer

__all__ = [
    "MixedPrecision",
    "PyTorchTrainable",
    "PyTorchTrainer",
    "get_mixed_precision",
    "train_epoch",
    "validate_epoch",
]
