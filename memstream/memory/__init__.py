"""The science of memstream, pure: clustering (CLAG), recurrence detection (RecMem), text signals.

This package owns every decision the pipeline makes about memories: which cluster a turn joins,
when a topic or entity has recurred enough to pay for consolidation, which turns carry
information, and which entities (orders, emails, phones, dates, products, parcels) a turn names;
then how consolidated memories are written (``extractive``, ``merge``, ``due``), how strong
they are (``strength``), which ones are related (``links``) and which promises fell due
(``reminders``); and what a bot reads (``retrieval``: ``candidates``, ``ranking``): current first
(``reconcile``), an order found by its names (``names``), standing attributes newest first
(``profile``), promises open until kept (``promises``), no chatter or formulaic lines
(``chatter``, ``formulaic``).
It imports only the standard library, numpy and the ``schemas`` contracts: no I/O, no clock
reads (time is always an argument), and every function is deterministic, so a replay of the
event log rebuilds exactly the same state.
"""
