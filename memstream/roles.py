"""The roles a memstream process plays, and the commands that name sets of them: the one
table the CLI, the launcher, the wiring and the stages read (part of the kernel: it imports
nothing, so the lightest module may use it)."""

from __future__ import annotations

from typing import Literal, cast

Role = Literal["process", "consolidate", "serve"]
# Every role, in the order ``--roles`` spells them.
ROLES: tuple[Role, ...] = ("process", "consolidate", "serve")
ALL_ROLES: frozenset[Role] = frozenset(ROLES)
# The roles that run stages (``serve`` runs the RPC).
StageRole = Literal["process", "consolidate"]
# The commands that are names for a set of roles (``memstream run --roles`` is the long form).
ROLE_SETS: dict[str, frozenset[Role]] = {
    "up": ALL_ROLES,
    "worker": frozenset({"process"}),
    "consolidator": frozenset({"consolidate"}),
    "serve": frozenset({"serve"}),
}


def parse_roles(text: str) -> frozenset[Role]:
    """``"process,serve"`` (or an alias such as ``up``) as roles; ValueError names a bad one."""
    if text.strip() in ROLE_SETS:
        return ROLE_SETS[text.strip()]
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in ROLES]
    if unknown or not names:
        raise ValueError(
            f"unknown role {', '.join(unknown) or repr(text)}: roles are "
            f"{','.join(ROLES)} (or one of {', '.join(ROLE_SETS)})"
        )
    return frozenset(cast("Role", name) for name in names)


def roles_arg(roles: frozenset[Role]) -> str:
    """The ``--roles`` value naming ``roles``, in a stable order."""
    return ",".join(role for role in ROLES if role in roles)
