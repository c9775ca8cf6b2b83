"""The verifier's tables (cache/verify.py): what a difference between two questions may be and still ask
the same thing. Everything not explained here is a difference that matters.

- ``FRAMES``: ways of putting the same question (how do I / how can I / how to; please, can you tell me),
  read as one token or as nothing;
- ``IGNORED``: words that never change what is asked (articles, the present of "be", "do" as a helper);
- ``SYNONYMS``: words of one meaning in the questions people ask, each read as the group's first word;
- ``CONTRACTIONS``, ``IRREGULAR``: forms of one word;
- ``PREPOSITIONS``: the words that open a phrase that may move in the sentence without changing its role
  ("in Lagos, where..." / "where ... in Lagos");
- ``NUMBER_WORDS``, ``SCALE``, ``CURRENCY_SIGNS``: numbers as digits;
- ``NEGATION_CUES``, ``UNIT_WORDS``: only to name a miss's reason ("negation", "units"), never to decide it;
- ``LANGUAGE_WORDS``: the commonest words of a few languages, to name the language.

A word belongs in ``SYNONYMS`` only if swapping it for its group's first word never changes the answer of
a question asked of an assistant; one that is usually a synonym but not always (mobile / phone: "mobile
money") stays out. The hard-negative generator (cache/negatives_words.py) keeps its own tables.
"""

from __future__ import annotations


def set_of(words: str) -> frozenset[str]:
    return frozenset(words.split())


def _groups(table: str) -> dict[str, str]:
    """``"buy purchase; car automobile"`` -> each word's group head (the first word)."""
    out: dict[str, str] = {}
    for group in table.split(";"):
        words = group.split()
        for word in words:
            # A word in two groups would silently take the later head and stop reading as the first.
            if word in out and out[word] != words[0]:
                raise ValueError(f"{word!r} is in two groups ({out[word]!r} and {words[0]!r})")
            out[word] = words[0]
    return out


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


HOW_TO = "<how-to>"  # how do I / how can I / how to ... : the one way of asking how something is done
WHERE_TO = "<where-to>"  # where can I / where do I / where to ...


def _frames(table: dict[str, str]) -> dict[str, str]:
    """``{reading: "phrase|phrase"}`` -> each phrase's reading ("" drops it)."""
    return {phrase: reading for reading, phrases in table.items() for phrase in phrases.split("|")}


# Phrases read as one token or as nothing, matched on the casefolded words (contractions expanded, accents
# folded), longest first. QUESTIONS anywhere but after a verb of knowing ("how to" opens a how-to question,
# "learn how to swim" is not one); OPENINGS only where the text (or a sentence) starts.
QUESTIONS: dict[str, str] = _frames(
    {
        HOW_TO: "how do i|how can i|how could i|how would i|how do you|how can you|how does one|how can one|"
        "how does someone|how can someone|how do we|how can we|how to|how i can|how you can|how one can|"
        "how we can|how someone can|how person dey|how dem dey|what is the way to|"
        "what is the best way to|what is the right way to|what is the proper way to|"
        "what is the correct way to|in what way can i|how i fit|how i go take|how person go take|"
        "how person fit|how i go|how we fit|what are the steps to|the steps to|steps to|"
        "comment puis je|comment je peux|comment peut on|comment on peut|comment faire pour|"
        "comment on fait pour|comment",
        WHERE_TO: "where can i|where do i|where to|where can one|where can you|where do you|where i fit|"
        "where person fit|where i go fit|ou puis je|ou peut on|ou",
    }
)
KNOWING = set_of(
    "know learn show teach explain understand tell ask wonder decide see figure out find idea sure"
)
OPENINGS: dict[str, str] = _frames(
    {
        "": "hi|hello|hey|hi there|hello there|good morning|good afternoon|good evening|dear assistant|"
        "excuse me|sorry to bother you|sorry to bother you but|quick question|thanks in advance|"
        "i need help|please help|help|i have a question|question|how far|bonjour|salut|"
        "i would be grateful if you could tell me|i would love to know|i would like to know|"
        "i want to know|i wanna know|i was wondering|i wonder|do you know|help me understand|"
        "can you help me understand|could you help me understand|so|ok so|okay so|ok so like|so like|um|"
        "hmm|oh|bro|bros|sis|boss|oga|my guy|my people|guys|please help me|help me|pls help|lol|but|"
        "abeg o|please o",
    }
)
# Anywhere in a phrase.
FRAMES: dict[str, str] = _frames(
    {
        "": "can you tell me|could you tell me|can you please tell me|could you please tell me|"
        "please tell me|tell me|explain to me what|explain to me|explain what|explain|explaining|please|"
        "kindly|biko|i beg|thanks|sef|abi|sha|jare|lol|give me|show me|"
        "thank you|thank u|se il vous plait|se il te plait|svp|stp|dis moi|dites moi|"
        "pouvez vous me dire|peux tu me dire|merci|est ce que|what is|what are|what s|wetin be|"
        "na wetin be|que est ce que|que est ce qu|quel est|quelle est|quels sont|quelles sont",
        "what": "which|wetin",
        "phone": "mobile phone|cell phone|smart phone|phone handset",
        "remove": "get rid of",
        "install": "set up",
        "electricity bill": "power bill|light bill|electric bill|electricity bill",
        "blood pressure": "bp|blood pressure",
        "maigrir": "perdre du poids|perdre de le poids",
        "email": "e mail|email address|e mail address|adresse email|adresse e mail",
        "wifi": "wi fi",
        "signup": "sign up",
        "login": "log in|sign in",
        "logout": "log out|sign out",
    }
)
# "Can you ..." asking the assistant for something: dropped before a verb of asking ("can you give me a
# recipe" is "give me a recipe"), kept before any other ("can you eat raw eggs" is about eating them).
REQUEST_OPENERS: frozenset[str] = frozenset(
    f"{modal} you{extra}"
    for modal in ("can", "could", "would", "will")
    for extra in ("", " please", " kindly", " mind")
)
REQUEST_VERBS = set_of(
    "tell give show list explain explaining summarise summarize write suggest recommend describe translate "
    "name define help share provide"
)
FRAME_WORDS = max(len(p.split()) for table in (QUESTIONS, OPENINGS, FRAMES) for p in table)

# Words that never change what is asked.
IGNORED = set_of(
    # English: articles, the present of "be", "do" as a helper
    "a an the is are am be do does "
    # Nigerian Pidgin: the copula, "the", and "wey" (that, who, which) opening a relative clause
    "na di wey "
    # French: articles, the present of "être", the question's "est-ce"
    "le la les l un une est sont ce c"
)
# Helpers dropped above that start a clause: a phrase ("to Kenya from Nigeria") ends before them ("do I
# need a visa").
CLAUSE_HELPERS = set_of("is are am be do does est sont")
# Words that start a clause: a phrase opened by a preposition ends before them ("for sickle cell patients
# what foods are good").
CLAUSE_WORDS = set_of(
    "what how why who whom whose where can could should would will must may might shall did was were fit "
    "suppose"
)
# The asker's and the listener's: one on one side only is the same question ("reset my password" / "reset
# the password"); one on each side is not ("what is my name" / "what is your name").
POSSESSIVES = set_of("my your our mon ma mes ton ta tes votre vos notre nos")
# French contractions of "de" / "à" + article read as the preposition.
ARTICLE_FORMS = {"du": "de", "des": "de", "d": "de", "au": "à", "aux": "à"}

# Whole questions put another way, "*" standing for the rest: read as the form on the right.
REWRITES: tuple[tuple[str, str], ...] = (
    ("what does * mean", "meaning of *"),
    ("wetin * mean", "meaning of *"),
    ("define *", "meaning of *"),
    ("what is the definition of *", "meaning of *"),
    ("definition of *", "meaning of *"),
    ("what is the meaning of *", "meaning of *"),
    ("wetin be the meaning of *", "meaning of *"),
    ("how much does * cost", "price of *"),
    ("how much do * cost", "price of *"),
    ("how much is *", "price of *"),
    ("how much are *", "price of *"),
    ("how much be *", "price of *"),
    ("how much * cost", "price of *"),
    ("what does * cost", "price of *"),
    ("what is the cost of *", "price of *"),
    ("what is the price of *", "price of *"),
    ("cost of *", "price of *"),
)

SYNONYMS: dict[str, str] = _groups(
    "buy purchase; car automobile voiture auto; phone cellphone smartphone handset; begin start commence;"
    "big large; fast quick quickly rapid rapidly; cheap inexpensive affordable; reduce lower decrease;"
    "child kid pikin; doctor physician; film movie; remove eliminate delete erase; fix repair;"
    "restart reboot; install setup; cook prepare make; help assist; symptom sign; cost price;"
    "maize corn; pawpaw papaya; groundnut peanut; petrol gasoline; lorry truck; flat apartment;"
    "holiday vacation; television tv; okay ok; because cuz bc; eat chop; mum mom mother mama;"
    "dad father papa; photo picture pic; ill sick; job work; home house; rubbish garbage trash;"
    "autumn fall; nappy diaper; exam examination; someone somebody; benefit advantage;"
    # French
    "symptome signe; reduire diminuer baisser; commencer debuter;"
    "moyen facon maniere; avantage bienfait; cultiver planter; prix cout; ecrire rediger;"
    "preparer faire cuisiner;"
    "enfant gosse; medecin docteur; telephone tel"
)

# Expanded before anything else is read; "n't" and the other clitics are split off by rule.
CONTRACTIONS: dict[str, str] = {
    "can't": "can not", "cannot": "can not", "won't": "will not", "shan't": "shall not", "ain't": "is not",
    "let's": "let us", "what's": "what is", "whats": "what is", "it's": "it is", "that's": "that is",
    "there's": "there is", "who's": "who is", "where's": "where is", "how's": "how is", "here's": "here is",
    "when's": "when is", "why's": "why is", "i'm": "i am", "im": "i am", "wanna": "want to",
    "gonna": "going to", "gotta": "have to", "dont": "do not", "doesnt": "does not", "cant": "can not",
    "isnt": "is not", "wont": "will not", "didnt": "did not", "arent": "are not", "wasnt": "was not",
    "ive": "i have", "youre": "you are", "theyre": "they are", "hasnt": "has not", "havent": "have not",
    "shouldnt": "should not", "couldnt": "could not", "wouldnt": "would not",
    # chat spellings of common words
    "idk": "i do not know", "gimme": "give me", "lemme": "let me", "wats": "what is", "sum1": "someone",
    "some1": "someone", "any1": "anyone", "every1": "everyone", "no1": "no one", "2day": "today",
    "2moro": "tomorrow", "2morrow": "tomorrow", "tmoro": "tomorrow", "2nite": "tonight", "gr8": "great",
    "thnx": "thanks", "thanx": "thanks", "hav": "have", "dnt": "do not", "shud": "should", "bt": "but",
    "tk": "take",
    "u": "you", "ur": "your", "thx": "thanks", "hw": "how", "wat": "what", "wht": "what", "wot": "what",
    "d": "the", "da": "the", "r": "are", "y": "why", "abt": "about", "bcos": "because", "bcoz": "because",
    "coz": "because", "wen": "when", "wia": "where", "shd": "should", "cud": "could", "wud": "would",
    "tmrw": "tomorrow", "tmr": "tomorrow", "b4": "before", "dat": "that", "dis": "this", "ppl": "people",
    "pple": "people", "frm": "from", "wit": "with", "wiv": "with", "gud": "good", "hv": "have", "cn": "can",
    "nd": "and", "n": "and", "pls": "please", "plz": "please", "pliz": "please", "abeg": "please",
    "acct": "account", "govt": "government", "fone": "phone", "bday": "birthday", "msg": "message",
    "hrs": "hours", "mins": "minutes", "yrs": "years", "wk": "week", "wks": "weeks",
    "diff": "difference", "info": "information", "pic": "picture", "pics": "pictures", "vid": "video",
    "sch": "school", "uni": "university",
}  # fmt: skip
# "n'", "l'", "d'" ... before a vowel in French: the word they stand for.
ELISIONS = {
    "l": "le",
    "d": "de",
    "j": "je",
    "qu": "que",
    "n": "ne",
    "s": "se",
    "c": "ce",
    "m": "me",
    "t": "te",
}

# Forms of one word a suffix rule would not find (or would find wrongly).
IRREGULAR: dict[str, str] = {
    "children": "child", "kids": "child", "men": "man", "women": "woman", "feet": "foot", "teeth": "tooth",
    "mice": "mouse", "geese": "goose", "people": "person", "lives": "life", "wives": "wife",
    "knives": "knife", "leaves": "leaf", "halves": "half", "news": "news", "series": "series",
    "species": "species", "physics": "physics", "mathematics": "mathematics", "maths": "maths",
    "economics": "economics", "politics": "politics", "glasses": "glasses", "goods": "goods",
    "clothes": "clothes", "means": "means", "during": "during", "morning": "morning", "evening": "evening",
    "nothing": "nothing", "something": "something", "anything": "anything", "everything": "everything",
    "thing": "thing", "things": "thing", "king": "king", "ring": "ring", "spring": "spring",
    "string": "string", "wing": "wing", "ceiling": "ceiling", "wedding": "wedding", "bus": "bus",
    "gas": "gas", "yes": "yes", "us": "us", "its": "its", "this": "this", "his": "his", "was": "was",
    "has": "has", "does": "does", "is": "is", "as": "as", "less": "less", "need": "need", "feed": "feed",
    "speed": "speed", "seed": "seed", "bleed": "bleed", "used": "used", "red": "red", "bed": "bed",
}  # fmt: skip

PREPOSITIONS: dict[str, frozenset[str]] = {
    "en": set_of(
        "of in on at for from to into onto with without by about during after before since until till "
        "than via per under over between among through across against near like towards toward within "
        "inside outside around behind beyond versus vs while when if unless"
    ),
    "fr": set_of("de à en dans pour sans avec sur sous chez par pendant apres avant entre vers contre si"),
}
PREPOSITIONS["pcm"] = PREPOSITIONS["en"]
# Joined words whose order is free ("salt and pepper", "Python or Java"): each side sorted.
CONJUNCTIONS = set_of("and or et ou")

NUMBER_WORDS: dict[str, str] = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13",
    "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18",
    "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60",
    "seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100", "thousand": "1000",
    "million": "1000000", "billion": "1000000000", "dozen": "12", "half": "0.5",
    "first": ordinal(1), "second": ordinal(2), "third": ordinal(3), "fourth": ordinal(4),
    "fifth": ordinal(5), "sixth": ordinal(6), "seventh": ordinal(7), "eighth": ordinal(8),
    "ninth": ordinal(9), "tenth": ordinal(10),
    "deux": "2", "trois": "3", "quatre": "4", "cinq": "5", "dix": "10", "cent": "100",
    "mille": "1000", "premier": ordinal(1), "premiere": ordinal(1), "deuxieme": ordinal(2),
    "troisieme": ordinal(3),
}  # fmt: skip
SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mn": 1e6, "million": 1e6, "b": 1e9, "bn": 1e9, "billion": 1e9}
CURRENCY_SIGNS = {"$": "dollar", "€": "euro", "£": "pound", "¥": "yen", "₦": "naira", "%": "percent"}

NEGATION_CUES = set_of(
    "not no never none nobody nothing nowhere neither nor without cannot ne pas jamais rien aucun sans"
)
UNIT_WORDS = set_of(
    "celsius fahrenheit kelvin km kilometer kilometre mile meter metre foot feet inch cm mm yard acre "
    "hectare kg kilogram kilo gram pound lb ounce oz ton tonne liter litre gallon ml cup teaspoon "
    "tablespoon second minute hour day week month year mph kph byte kb mb gb tb mbps watt kw kwh volt "
    "percent dollar euro "
    "naira cedi rand shilling yen rupee bitcoin usd eur gbp ngn kes ghs"
)

# A few languages' commonest words, to tell them apart (other scripts are told apart by script).
LANGUAGE_WORDS = {
    "en": set_of(
        "the is are what how why who which where when whom whose of and to in it for you do does did can "
        "i my me your a an with on at about from get give tell make should will would could might must "
        "this that there be been have has had was were not am any some all very so if or but as by up out "
        "just than then them they we he she his her its our their us him here into over under after "
        "before between during through also only even still too again ever every each other such own same "
        "many much"
    ),
    "pcm": set_of("wetin dey don abeg pikin wan una dem sabi wey chop comot abi oga"),
    "fr": set_of(
        "le la les est sont quel quelle quels quelles comment pourquoi qui des et pour vous une un du je au "
        "aux que quoi où combien dans avec sans sur mon ma mes ce cette faut peut"
    ),
    "es": set_of("el los las qué cómo por quién y para usted una del cuál cuánto está mejor"),
    "de": set_of("der das ist sind wie warum wer und für ein eine nicht mit ich"),
    "pt": set_of("os é são que como quem e em para você uma um da faço"),
    "yo": set_of("ni ti kò jẹ́ bí wo ṣe fún àti"),
    "sw": set_of(
        "ni na ya wa kwa za katika je nini gani kuhusu jinsi vipi wapi lini nani sana tafadhali habari yako "
        "lako langu hii huu kama kwenye"
    ),
    "ha": set_of("da ne ce yaya wane ina shin kuma akwai"),
    "ig": set_of("kedu bụ ka gị ndị nke"),
}

# Every word a table above names: a generated negative caught only through one of these is reported apart
# from those the general rule (an unexplained word) catches (cache-eval).
LISTED: frozenset[str] = (
    frozenset(
        w
        for table in (
            QUESTIONS,
            OPENINGS,
            FRAMES,
            SYNONYMS,
            CONTRACTIONS,
            IRREGULAR,
            NUMBER_WORDS,
            ARTICLE_FORMS,
        )
        for key, value in table.items()
        for w in (*key.split(), *value.split())
    )
    | IGNORED
    | NEGATION_CUES
    | UNIT_WORDS
    | frozenset().union(*PREPOSITIONS.values())
)
