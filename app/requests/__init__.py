"""The life of a confirmation request, from the gated call to its decision.

- :mod:`.kernel` decides a call: one pure function over one snapshot of what the database
  holds for it.
- :mod:`.gate` is the gate service the hooks talk to: it reads the snapshot, asks the kernel
  and applies its answer (a new request, a grant's use).
- :mod:`.intake` writes new requests (group commit).
- :mod:`.states` is the state machine (the transition table and the one conditional write).
- :mod:`.eligibility` says who may vote on which gate; :mod:`.votes` casts votes;
  :mod:`.tally` reads the votes cast.
- :mod:`.clicks` takes chat clicks; :mod:`.cards` draws what channels show.
- :mod:`.grants`, :mod:`.edits` and :mod:`.single_use`: what an approval authorizes.
- :mod:`.reminders`: when approvers are reminded and whom a request escalates to.

The wing emits events through the unit of work (:func:`signoff.app.db.emit`) and never imports
the wire shapes (``schemas``), ``webhooks``, routers or the console.
"""
