"""The static ad -> campaign mapping of YSB (the paper's static cache), deterministic for a given size."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

# A fixed namespace: the same sizes give the same ids in the generator, the join table and tests.
_NAMESPACE = uuid.UUID("6f1d0c52-4b1e-4d8a-9a56-2b7f3c1e9d40")


@dataclass(frozen=True)
class AdCampaign:
    ad_id: str
    campaign_id: str


def campaign_ids(campaigns: int) -> list[str]:
    return [str(uuid.uuid5(_NAMESPACE, f"campaign-{c}")) for c in range(campaigns)]


def ad_campaign_mapping(campaigns: int = 100, ads_per_campaign: int = 10) -> list[AdCampaign]:
    """YSB's layout: ``campaigns`` campaigns of ``ads_per_campaign`` ads each, ids as UUID strings."""
    if campaigns < 1 or ads_per_campaign < 1:
        raise ValueError("campaigns and ads_per_campaign must be at least 1")
    mapping = []
    for c, campaign in enumerate(campaign_ids(campaigns)):
        for a in range(ads_per_campaign):
            mapping.append(AdCampaign(str(uuid.uuid5(_NAMESPACE, f"ad-{c}-{a}")), campaign))
    return mapping
