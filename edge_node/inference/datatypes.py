"""OIP v2 datatype names ↔ numpy dtypes (the names are the wire contract's, ``fleetwire.datatypes``)."""

from __future__ import annotations

import numpy as np

from fleetwire.datatypes import NUMPY_TO_OIP, OIP_DTYPE_NAMES, oip_datatype

OIP_TO_NUMPY: dict[str, np.dtype] = {name: np.dtype(numpy) for name, numpy in OIP_DTYPE_NAMES.items()}

__all__ = ["NUMPY_TO_OIP", "OIP_TO_NUMPY", "oip_datatype"]
