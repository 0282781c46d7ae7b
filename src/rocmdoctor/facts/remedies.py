"""The remedies `rocmdoctor fix` applies, by id, and the check whose finding each answers: the one registry.

`fix --only` takes its choices from here (a remedy's id, a part of one, or the id of a check it answers),
provision/fix.py plans exactly these ids (tests/unit/test_remedies.py compares them), and every
`fix --only` id in a check's remedy or in docs/ must name an id here (the same test). Data, below
both `checks/` and `provision/`, so that each can name a remedy without importing the other.
"""

from __future__ import annotations

# remedy id -> the check ids it answers
FIXES: dict[str, tuple[str, ...]] = {
    "groups": ("access.devices",),
    "ttm": ("memory.ttm",),
    "cmdline": ("env.multi_gpu", "memory.ttm"),
    "udev": ("access.devices",),
    "orphans": ("processes.orphans",),
    "dkms": ("driver.dkms",),
}
# part id -> (its remedy, the kernel parameter it adds or removes, the check it answers)
PARTS: dict[str, tuple[str, str, str]] = {
    "cmdline.iommu": ("cmdline", "iommu", "env.multi_gpu"),
    "cmdline.gttsize": ("cmdline", "amdgpu.gttsize", "memory.ttm"),
}


def check_ids() -> tuple[str, ...]:
    return tuple(sorted({c for checks in FIXES.values() for c in checks}))


def choices() -> tuple[str, ...]:
    """Everything `fix --only` accepts."""
    return (*FIXES, *PARTS, *check_ids())


def answering(check_id: str) -> tuple[str, ...]:
    """The remedies that answer a check (what its result names as `fix`)."""
    return tuple(fix for fix, checks in FIXES.items() if check_id in checks)


def selected(only: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(remedy ids, kernel parameters the cmdline remedy is limited to) for `fix --only`; empty: all."""
    ids: set[str] = set()
    params: set[str] = set()
    whole_cmdline = False
    for choice in only:
        if choice in FIXES:
            ids.add(choice)
            whole_cmdline |= choice == "cmdline"
        elif choice in PARTS:
            ids.add(PARTS[choice][0])
            params.add(PARTS[choice][1])
        else:
            ids.update(answering(choice))
            whole_cmdline |= "cmdline" in answering(choice)
    return ids, set() if whole_cmdline else params


def fixable(*fix_ids: str) -> dict[str, list[str]]:
    """What a check's warning or failure carries when `rocmdoctor fix` answers it: `{"fix": [ids]}` in its
    details, machine-readable (`fix --only ID`); an id that is not registered is a programming error."""
    unknown = [f for f in fix_ids if f not in choices()]
    if unknown:
        raise ValueError(f"not a registered remedy: {unknown}")
    return {"fix": list(fix_ids)}
