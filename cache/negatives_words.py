"""The hard-negative generator's word tables (cache/negatives.py), kept apart from the verifier's.

Nothing here may be imported by the verifier (cache/verify.py): a negative that the verifier catches only
because it lists the very word the generator put in would prove nothing. ``tests/cache/test_negatives.py``
checks that the two sets of tables stay apart where it matters, and cache-eval reports which negatives were
caught by a word the verifier lists and which by its general rule.

Each table is per language: ``en`` (English), ``pcm`` (Nigerian Pidgin), ``fr`` (French). Pairs are written
``"a b"`` and read both ways; groups are words of one kind, any one of which may replace another.
"""

from __future__ import annotations


def _pairs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in text.split(";"):
        words = entry.split()
        if len(words) == 2:
            a, b = words
            out.setdefault(a, b)
            out.setdefault(b, a)
    return out


def _list(text: str) -> list[str]:
    return text.split()


def _groups(text: str) -> list[list[str]]:
    return [g.split() for g in text.split(";") if len(g.split()) >= 2]


# Opposite verbs, adjectives and adverbs.
ANTONYMS: dict[str, dict[str, str]] = {
    "en": _pairs(
        "buy sell; increase decrease; borrow lend; import export; upload download; arrive leave;"
        "hot cold; cheap expensive; early late; heavy light; wide narrow; deep shallow; thick thin;"
        "raise lower; gain lose; remember forget; push pull; inhale exhale; accept refuse; send receive;"
        "sweet bitter; soft hard; loud quiet; tall short; young old; fresh stale; rough smooth; tight loose;"
        "strong weak; rich poor; healthy unhealthy; legal illegal; possible impossible; happy sad;"
        "warm cool; dry wet; clean dirty; fast slow; quickly slowly; up down; inside outside; before after;"
        "start stop; enter exit; win lose; attack defend; love hate; male female; day night; summer winter;"
        "north south; east west; safe risky; visible invisible; common rare; public private; cause prevent;"
        "online offline; true false; open close; allowed banned; full empty; near far; above below;"
        "maximum minimum; add subtract; multiply divide; expand shrink; lighten darken; tighten loosen;"
        "charge discharge; encrypt decrypt; freeze melt; sink float; employer employee; teacher student;"
        "landlord tenant; seller buyer; import export; debit credit; asset liability; innocent guilty"
    ),
    "pcm": _pairs(
        "buy sell; borrow lend; hot cold; big small; fine ugly; sweet bitter; strong weak; rich poor;"
        "come go; open close; wake sleep; cheap costly; near far; early late; enter comot; start stop;"
        "win lose; love hate; day night; up down"
    ),
    "fr": _pairs(
        "acheter vendre; augmenter diminuer; chaud froid; grand petit; facile difficile; ouvrir fermer;"
        "monter descendre; gagner perdre; entrer sortir; avant après; rapide lent; rapidement lentement;"
        "cher bon; riche pauvre; fort faible; jeune vieux; propre sale; plein vide; léger lourd;"
        "commencer arrêter; envoyer recevoir; importer exporter; emprunter prêter; allumer éteindre;"
        "jour nuit; été hiver; nord sud; haut bas; début fin; premier dernier"
    ),
}

# Words of one kind: another member of the kind asks another question.
SIBLINGS: dict[str, list[list[str]]] = {
    "en": _groups(
        "kilometres miles metres feet inches; km miles; kilograms pounds ounces grams; kg lbs;"
        "celsius fahrenheit kelvin; litres gallons cups; dollars euros pounds naira cedis shillings rand;"
        "dollar euro naira cedi shilling rand yen; usd eur gbp ngn ghs kes;"
        "python javascript java rust ruby php kotlin swift; excel sheets word powerpoint;"
        "windows linux macos android ios; iphone android; whatsapp telegram signal instagram facebook tiktok;"
        "essay poem letter story speech report; cv resume; dog cat goat sheep cow horse chicken pig;"
        "dogs cats goats sheep cows horses chickens pigs; rice beans yam cassava maize plantain;"
        "monday tuesday wednesday thursday friday saturday sunday;"
        "january february april june july august september october november december;"
        "nigeria ghana kenya senegal egypt ethiopia cameroon uganda tanzania rwanda;"
        "lagos abuja accra nairobi dakar kampala kigali cairo london paris;"
        "doctor nurse lawyer teacher engineer pharmacist accountant;"
        "football basketball tennis cricket rugby volleyball; red blue green yellow black white;"
        "tea coffee; beer wine; breakfast lunch dinner; morning evening; spring autumn;"
        "brother sister cousin uncle aunt; son daughter; husband wife; baby toddler teenager adult;"
        "children adults teenagers babies; kidney liver heart lung; kidneys lungs;"
        "ibuprofen paracetamol aspirin; english french spanish arabic swahili yoruba hausa igbo;"
        "bus train taxi plane; car motorcycle bicycle; gold silver; bitcoin ethereum;"
        "visa passport; mtn airtel glo; android iphone; mouse keyboard; laptop tablet phone"
    ),
    "pcm": _groups(
        "naira dollar cedi pound; rice beans yam garri plantain; lagos abuja kano port-harcourt ibadan;"
        "mama papa; pikin mama papa; brother sister; goat chicken cow; football basketball; mtn airtel glo;"
        "whatsapp facebook instagram tiktok; phone laptop; bus okada keke taxi; jamb waec neco"
    ),
    "fr": _groups(
        "kilomètres miles mètres; euros dollars francs; euro dollar franc; français anglais arabe espagnol;"
        "python java javascript; chien chat chèvre mouton vache; riz manioc igname maïs;"
        "lundi mardi mercredi jeudi vendredi samedi dimanche; dakar abidjan paris bamako lomé;"
        "sénégal mali ghana france maroc; médecin infirmier avocat professeur; football basketball tennis;"
        "lettre poème discours rapport; frère sœur; fils fille; enfants adultes; thé café;"
        "whatsapp facebook instagram; bus taxi train avion"
    ),
}

# Qualifiers added at the end of a question (an audience, a condition, a constraint).
QUALIFIERS: dict[str, list[str]] = {
    "en": [
        "for children", "for a toddler", "for pregnant women", "for someone with diabetes",
        "for a beginner", "for elderly people", "if it rains", "without a car", "in winter",
        "on a budget of 50 dollars", "without a prescription", "at night", "after surgery",
        "with no internet", "while breastfeeding", "on a Mac", "in an emergency", "without an oven",
        "for a small business", "if I have high blood pressure",
    ],
    "pcm": [
        "for pikin", "for small pikin", "for belle woman", "for old people", "if rain fall",
        "without motor", "for night", "if I no get money", "without light",
    ],
    "fr": [
        "pour les enfants", "pour un bébé", "pour une femme enceinte", "pour un débutant",
        "sans ordonnance", "en hiver", "sans voiture", "la nuit", "sans internet", "pour les personnes âgées",
    ],
}  # fmt: skip

QUANTIFIERS: dict[str, list[list[str]]] = {
    "en": _groups(
        "all some none most few; every no; always never sometimes often rarely; many few; both neither"
    ),
    "pcm": _groups("all some; everybody nobody; always never"),
    "fr": _groups("tous certains; toujours jamais parfois; beaucoup peu; chaque aucun"),
}

NUMBER_WORDS: dict[str, list[str]] = {
    "en": _list("two three four five six seven eight nine ten twelve twenty hundred thousand"),
    "pcm": _list("two three four five six seven ten"),
    "fr": _list("deux trois quatre cinq six sept huit dix vingt cent mille"),
}

# Modals at the head of a question, each with another that asks another thing.
MODALS: dict[str, dict[str, str]] = {
    "en": {"can": "must", "should": "can", "must": "may", "may": "must", "could": "should", "will": "should",
           "would": "must", "do": "should", "does": "should", "is": "must", "are": "must"},
    "pcm": {"fit": "suppose", "suppose": "fit", "wan": "fit", "go": "fit"},
    "fr": {"peut": "doit", "doit": "peut", "peux": "dois", "dois": "peux", "faut": "peut", "puis": "dois"},
}  # fmt: skip

SUPERLATIVES: dict[str, dict[str, str]] = {
    "en": _pairs(
        "largest smallest; biggest smallest; most least; best worst; highest lowest; fastest slowest;"
        "oldest newest; cheapest priciest; longest shortest; richest poorest; safest riskiest;"
        "hottest coldest; tallest shortest; easiest hardest; strongest weakest; deepest shallowest;"
        "busiest quietest; healthiest unhealthiest; greatest least; heaviest lightest"
    ),
    "pcm": _pairs("best worst; biggest smallest; most least"),
    "fr": _pairs("meilleur pire; meilleure pire; grand petit; long court; riche pauvre"),
}
# An ordinal put before a superlative: "the largest" -> "the second largest".
ORDINAL_BEFORE: dict[str, str] = {"en": "second", "pcm": "second", "fr": "deuxième"}
ORDINALS: dict[str, list[list[str]]] = {
    "en": _groups("first second third fourth fifth last; 1st 2nd 3rd 4th"),
    "pcm": _groups("first second third last"),
    "fr": _groups("premier deuxième troisième dernier; première deuxième troisième dernière"),
}

# Question-initial tense markers and the tense that replaces them.
TENSES: dict[str, dict[str, str]] = {
    "en": {"is": "was", "are": "were", "was": "is", "were": "are", "does": "did", "do": "did",
           "did": "will", "will": "did", "has": "had"},
    "pcm": {"dey": "don", "don": "go", "go": "don"},
    "fr": {"est": "était", "sont": "étaient", "a": "avait", "était": "est"},
}  # fmt: skip

# Negation put after the question's first auxiliary (en), before its verb (pcm), around it (fr).
NEGATE_AFTER: dict[str, frozenset[str]] = {
    "en": frozenset(_list("is are was were can could should would will must do does did may might")),
    "pcm": frozenset(_list("fit dey go don wan suppose")),
    "fr": frozenset(),
}
FRENCH_NEGATIONS = {
    "est": "n'est pas", "sont": "ne sont pas", "peut": "ne peut pas", "faut": "ne faut pas",
    "peux": "ne peux pas", "dois": "ne dois pas", "doit": "ne doit pas", "a": "n'a pas",
}  # fmt: skip

# Whose situation: the asker's own replaced by someone else's.
PERSONS: dict[str, list[str]] = {
    "en": ["my child", "my grandmother", "my dog", "a teenager", "my husband"],
    "pcm": ["my pikin", "my mama", "my papa"],
    "fr": ["mon enfant", "ma grand-mère", "mon chien"],
}

# Common nouns an argument swap may exchange (two of them in one question, not joined by and / or).
NOUNS: frozenset[str] = frozenset(
    _list("""
    dog dogs cat cats chocolate coffee tea water milk sugar salt rice beans yam cassava chicken meat fish egg
    eggs fruit vegetable vegetables tomato tomatoes bread oil money bank phone phones laptop computer car
    cars bus house school teacher student students parent parents child children baby doctor nurse patient
    patients lawyer landlord tenant employer employee boss worker workers husband wife mother father son
    daughter brother sister friend man woman men women boy girl boys girls virus bacteria disease malaria
    fever headache stress sleep diabetes exercise weight pressure alcohol smoking cancer heart brain liver
    kidney stomach skin hair eyes teeth blood rain sun moon earth wind heat cold fire ice air
    python javascript java excel word file folder email password account app apps website
    price prices tax taxes salary rent loan debt interest inflation naira dollar
    """)
)

# Words that make a swap of the two words around them harmless ("between A and B", "A or B").
SWAP_JOINERS: frozenset[str] = frozenset(_list("and or between versus vs nor with et ou entre"))
