"""A figure's record (its JSON) written so that a redraw does not rewrite it for float noise: numbers rounded to a
fixed number of significant digits when stored, and a refit that moves only the last digits (BLAS in a fit, another
machine) keeping the stored ones; infinite and NaN floats stored as null (finite_json), so that the JSON is standard."""
import math


def significant(value, digits: int = 6):
    """value with every float rounded to `digits` significant digits (the JSON's trajectories)."""
    if isinstance(value, dict):
        return {k: significant(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [significant(v, digits) for v in value]
    return float(f"{value:.{digits}g}") if isinstance(value, float) else value


def same_numbers(a, b, rel: float = 1e-9) -> bool:
    """Nested dicts and lists equal, floats to `rel` (NaN equal to NaN). A refit on another machine moves the last
    digits (BLAS in polyfit, ~1e-13), which is no reason to rewrite a committed record."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_numbers(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_numbers(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel)
    return a == b


def settle(new, old, rel: float = 1e-9):
    """new, with every part that differs from old's by float noise alone taken from old: a record rewritten for a new
    number keeps the last digits of the others."""
    if same_numbers(new, old, rel):
        return old
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: settle(v, old[k], rel) if k in old else v for k, v in new.items()}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [settle(x, y, rel) for x, y in zip(new, old)]
    return new


def finite_json(value):
    """value with every infinite or NaN float as None (null: "beyond the run"), so that the JSON is standard."""
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value
