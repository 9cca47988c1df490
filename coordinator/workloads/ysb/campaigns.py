"""The static ad -> campaign mapping of YSB (the paper's static cache), deterministic for a given size.

Ids are UUID-shaped strings (as in YSB) made from the ad's and the campaign's numbers, so the query can
compute them with a few string functions (pipeline.ad_id_column) instead of carrying a literal list
of every ad id in its plan: a 10,000-element literal made every micro-batch's plan, task binary and
retained UI plan description hundreds of kilobytes large (the driver ran out of heap).
"""

from __future__ import annotations

from dataclasses import dataclass

# The table as one Redis hash (ad id -> campaign id), as YSB's setup stores it; the continuous
# query's join loads it from there.
ADS_KEY = "ysb:ad_campaign"


@dataclass(frozen=True)
class YsbLoad:
    """What YSB generates on either engine: ``rate`` events per second over ``campaigns`` of
    ``ads_per_campaign`` ads (the engines' options add their own fields)."""

    rate: int = 20_000
    campaigns: int = 100
    ads_per_campaign: int = 10


@dataclass(frozen=True)
class AdCampaign:
    ad_id: str
    campaign_id: str


def campaign_id(campaign: int) -> str:
    return f"{campaign:08x}-0000-4000-a000-000000000000"


def ad_id(campaign: int, ad: int, ads_per_campaign: int) -> str:
    """Ad number ``ad`` of ``campaign``; the last group is the ad's index over all campaigns."""
    return f"{campaign:08x}-{ad:04x}-4000-8000-{campaign * ads_per_campaign + ad:012x}"


def campaign_ids(campaigns: int) -> list[str]:
    return [campaign_id(c) for c in range(campaigns)]


def ad_campaign_mapping(campaigns: int = 100, ads_per_campaign: int = 10) -> list[AdCampaign]:
    """YSB's layout: ``campaigns`` campaigns of ``ads_per_campaign`` ads each."""
    if campaigns < 1 or ads_per_campaign < 1:
        raise ValueError("campaigns and ads_per_campaign must be at least 1")
    return [
        AdCampaign(ad_id(c, a, ads_per_campaign), campaign_id(c))
        for c in range(campaigns)
        for a in range(ads_per_campaign)
    ]
