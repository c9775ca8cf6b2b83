"""The three intent datasets that :mod:`cache.judge_pairs` makes pairs from, each read from a pinned commit.

Each source is a public repository of single utterances labelled by intent (banking77, CLINC150, HWU64; their
licences and attributions are in ``cache/data/judge/README.md``). A reader turns the repository's files into
:class:`Utterance` rows; :class:`PairRules` holds what the pair maker must know per source: the
intents never paired as the same question (their answer depends on a value in the question) and, for
banking77, the pairs of intents too close in meaning to serve as each other's negatives.

The commits are pinned here so that a rebuild reads exactly the files the shipped pairs were made from; a
clone that lacks the commit is refused rather than read at another version.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Utterance:
    id: str  # unique within its source: "split:row" or HWU64's "answerid:N"
    text: str
    intent: str
    domain: str  # negatives are drawn from the same domain
    entities: frozenset[tuple[str, str]] = frozenset()  # (type, value) where the source annotates them


@dataclass(frozen=True, slots=True)
class PairRules:
    never_same: frozenset[str] = frozenset()  # intents whose answer depends on a value in the question
    confusable: tuple[tuple[str, str], ...] = ()  # intent pairs never used as each other's negatives
    max_positives: int = 9000
    max_negatives: int = 10000
    same_entities: bool = False  # positives must carry identical annotated entities


@dataclass(frozen=True, slots=True)
class PinnedTree:
    """One commit of a repository, read through its git directory (a bare clone or a clone's ``.git``)."""

    git_dir: Path
    commit: str
    repository: str

    def _git(self, *args: str) -> str:
        done = subprocess.run(["git", "--git-dir", str(self.git_dir), *args], capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.git_dir}: cannot read {self.repository} @ {self.commit} "
                f"({done.stderr.decode(errors='replace').strip()})"
            )
        return done.stdout.decode("utf-8")

    def read(self, path: str) -> str:
        return self._git("show", f"{self.commit}:{path}")

    def paths(self, *folders: str) -> list[str]:
        """Every file under ``folders``, in git's (sorted) tree order."""
        return self._git("ls-tree", "-r", "--name-only", self.commit, "--", *folders).splitlines()


@dataclass(frozen=True, slots=True)
class IntentSource:
    name: str
    repository: str
    commit: str
    read: Callable[[PinnedTree], list[Utterance]]
    rules: PairRules = field(default_factory=PairRules)

    def tree(self, git_dir: Path) -> PinnedTree:
        # A clone's work tree is accepted too: its git directory is the `.git` inside.
        if (git_dir / ".git").is_dir():
            git_dir = git_dir / ".git"
        return PinnedTree(git_dir, self.commit, self.repository)


def read_banking77(tree: PinnedTree) -> list[Utterance]:
    utterances = []
    for split in ("train", "test"):
        for row_number, row in enumerate(csv.DictReader(io.StringIO(tree.read(f"banking_data/{split}.csv")))):
            utterances.append(Utterance(f"{split}:{row_number}", row["text"], row["category"], "banking"))
    return utterances


def read_clinc150(tree: PinnedTree) -> list[Utterance]:
    # The in-scope splits only: out-of-scope utterances have no intent to pair by.
    data = json.loads(tree.read("data/data_full.json"))
    domain_of = {
        intent: domain
        for domain, intents in json.loads(tree.read("data/domains.json")).items()
        for intent in intents
    }
    return [
        Utterance(f"{split}:{row_number}", text, intent, domain_of[intent])
        for split in ("train", "val", "test")
        for row_number, (text, intent) in enumerate(data[split])
    ]


# The cross-validation fold whose train and test sets together are the 10,020 annotated utterances.
HWU_FOLD = "CrossValidation/autoGeneFromRealAnno/autoGene_2018_03_22-13_01_25_169/CrossValidation/KFold_1/"
HWU_ENTITY = re.compile(r"\[\s*([^:\]]+?)\s*:\s*([^\]]+?)\s*\]")  # "[time : nine thirty pm]"


def read_hwu64(tree: PinnedTree) -> list[Utterance]:
    by_id: dict[str, Utterance] = {}
    for path in tree.paths(HWU_FOLD + "trainset", HWU_FOLD + "testset/csv"):
        if not path.endswith(".csv"):
            continue
        for row in csv.DictReader(io.StringIO(tree.read(path)), delimiter=";"):
            entities = frozenset(
                (found.group(1).strip(), found.group(2).strip().lower())
                for found in HWU_ENTITY.finditer(row["answer_annotation"])
            )
            # The user's own words keep their case; the annotators' copy is all lowercase.
            text = row["answer_from_user"] or row["answer_from_anno"]
            intent = f"{row['scenario']}_{row['intent']}"
            utterance = Utterance(f"answerid:{row['answerid']}", text, intent, row["scenario"], entities)
            by_id.setdefault(utterance.id, utterance)  # about 1,000 answers are in two of the files
    return list(by_id.values())


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# The answer depends on a currency, country or card brand named in the question.
BANKING_NEVER_SAME = _word_set(
    """exchange_rate fiat_currency_support country_support supported_cards_and_currencies exchange_via_app
    visa_or_mastercard"""
)
# Intents that overlap so much in meaning that one's utterance is often a fair answer to the other's.
BANKING_CONFUSABLE = (
    ("card_arrival", "card_delivery_estimate"),
    ("top_up_failed", "top_up_reverted"),
    ("pending_top_up", "top_up_failed"),
    ("pending_top_up", "verify_top_up"),
    ("balance_not_updated_after_bank_transfer", "transfer_not_received_by_recipient"),
    ("balance_not_updated_after_bank_transfer", "pending_transfer"),
    ("pending_transfer", "transfer_timing"),
    ("pending_transfer", "transfer_not_received_by_recipient"),
    ("why_verify_identity", "verify_my_identity"),
    ("unable_to_verify_identity", "verify_my_identity"),
    ("lost_or_stolen_card", "compromised_card"),
    ("getting_virtual_card", "get_disposable_virtual_card"),
    ("get_physical_card", "order_physical_card"),
    ("Refund_not_showing_up", "request_refund"),
    ("card_payment_fee_charged", "extra_charge_on_statement"),
    ("transaction_charged_twice", "extra_charge_on_statement"),
    ("card_not_working", "declined_card_payment"),
    ("virtual_card_not_working", "card_not_working"),
    ("pending_card_payment", "declined_card_payment"),
    ("failed_transfer", "declined_transfer"),
    ("cash_withdrawal_charge", "extra_charge_on_statement"),
    ("top_up_by_card_charge", "card_payment_fee_charged"),
    ("wrong_exchange_rate_for_cash_withdrawal", "card_payment_wrong_exchange_rate"),
    ("pending_cash_withdrawal", "cash_withdrawal_not_recognised"),
    ("declined_cash_withdrawal", "card_not_working"),
    ("contactless_not_working", "card_not_working"),
    ("activate_my_card", "card_not_working"),
    ("getting_spare_card", "order_physical_card"),
    ("pin_blocked", "change_pin"),
    ("passcode_forgotten", "pin_blocked"),
    ("transfer_fee_charged", "extra_charge_on_statement"),
    ("exchange_charge", "extra_charge_on_statement"),
)
# The answer depends on a value in the request (city, currency, dish, contact, account, date, amount...).
# What is left are fixed questions and requests (small talk, meta, pto_balance, credit_score, routing...).
CLINC_NEVER_SAME = _word_set(
    """shopping_list todo_list translate exchange_rate flight_status timezone definition spelling calculator
    measurement_conversion distance directions weather time date plug_type international_visa vaccines
    travel_alert calories nutrition_info recipe cook_time food_last ingredients_list ingredient_substitution
    restaurant_reviews restaurant_reservation restaurant_suggestion how_busy accept_reservations
    confirm_reservation cancel_reservation book_flight book_hotel car_rental uber make_call text
    share_location timer alarm reminder reminder_update todo_list_update shopping_list_update
    calendar_update calendar play_music update_playlist smart_home change_user_name change_ai_name
    change_language change_accent change_volume change_speed roll_dice meeting_schedule schedule_meeting
    pto_request transfer pay_bill order order_checks travel_suggestion meal_suggestion traffic mpg gas
    gas_type oil_change_when tire_pressure tire_change last_maintenance schedule_maintenance
    credit_limit_change travel_notification international_fees fun_fact tell_joke interest_rate balance
    bill_balance bill_due min_payment spending_history transactions insurance_change"""
)
# The answer depends on a value in the request (a song, a date, a fact asked about, a list's name...), or the
# utterance means something only within its conversation (yes, no, say that again).
HWU_NEVER_SAME = _word_set(
    """lists_remove lists_query general_affirm general_negate general_praise general_confirm
    general_commandstop general_repeat music_likeness music_settings qa_factoid qa_definition qa_currency
    qa_maths qa_stock general_quirky general_dontcare general_explain datetime_convert play_music play_radio
    play_podcasts play_audiobook play_game music_query news_query cooking_recipe recommendation_events
    recommendation_locations recommendation_movies email_sendemail social_post takeaway_order
    transport_ticket lists_createoradd calendar_set alarm_set general_joke"""
)

SOURCES = {
    source.name: source
    for source in (
        IntentSource(
            "banking77",
            "github.com/PolyAI-LDN/task-specific-datasets",
            "57ec275d8078af65b7731c2a98be812d844a6d6b",
            read_banking77,
            PairRules(BANKING_NEVER_SAME, BANKING_CONFUSABLE),
        ),
        IntentSource(
            "clinc150",
            "github.com/clinc/oos-eval",
            "828f8093932c8fe6ca7936c3d2e52903b1c523de",
            read_clinc150,
            PairRules(CLINC_NEVER_SAME, max_positives=6000, max_negatives=7000),
        ),
        IntentSource(
            "hwu64",
            "github.com/xliuhw/NLU-Evaluation-Data",
            "f6071b496b17d71e6eb43f543af0707f4ff30557",
            read_hwu64,
            PairRules(HWU_NEVER_SAME, max_positives=6000, max_negatives=7000, same_entities=True),
        ),
    )
}
