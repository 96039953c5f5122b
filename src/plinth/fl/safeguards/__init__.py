"""Round safeguards from the app spec, one module per job: the robust-rule round (robust.py),
the DP round (dp.py), the consent hook (consent.py), the collecting accumulator
(collecting.py), composed by `Safeguards` (rounds.py).

The decisions themselves are the pure functions of `plinth.fl.robust` and `plinth.fl.privacy`;
these modules feed them the round's updates and keep the state that spans rounds.
"""

from plinth.fl.safeguards.collecting import CollectingAggregator
from plinth.fl.safeguards.robust import root_trainer
from plinth.fl.safeguards.rounds import Safeguards

__all__ = ["CollectingAggregator", "Safeguards", "root_trainer"]
