"""Runtime hook of the frozen bundle, run before the app's own code.

torch.compile (inductor) needs a C++ compiler, Python's headers and torch's headers at run time.
The bundle ships none of them, so compiling would always fail after a wasted attempt; the fast
path runs eagerly instead. TANDEM_COMPILE set by the user still wins.
"""

import os

os.environ.setdefault("TANDEM_COMPILE", "off")
