"""The verifier's word lists (cache/verify.py): negation cues, pairs of opposites, units, dates, languages.

Lists, not logic: each entry is what a check compares. Pairs are written ``word / opposite, opposite`` and
read both ways; a check fires only when each side of a cached pair holds its own half.
"""

from __future__ import annotations


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _pairs(table: str) -> dict[str, frozenset[str]]:
    """``"good / bad, poor; true / false"`` -> each word's opposites, both ways."""
    out: dict[str, set[str]] = {}
    for entry in table.split(";"):
        if not entry.strip():
            continue
        left, right = entry.split("/")
        for a in (w.strip() for w in left.split(",")):
            for b in (w.strip() for w in right.split(",")):
                out.setdefault(a, set()).add(b)
                out.setdefault(b, set()).add(a)
    return {word: frozenset(opposites) for word, opposites in out.items()}


NUMBER_WORDS: dict[str, float | str] = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40,
    "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000,
    "million": 1_000_000, "billion": 1_000_000_000, "half": 0.5, "dozen": 12, "once": 1, "twice": 2,
    "double": 2, "triple": 3,
    "first": ordinal(1), "second": ordinal(2), "third": ordinal(3), "fourth": ordinal(4),
    "fifth": ordinal(5), "sixth": ordinal(6), "seventh": ordinal(7), "eighth": ordinal(8),
    "ninth": ordinal(9), "tenth": ordinal(10),
}  # fmt: skip
SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mn": 1e6, "million": 1e6, "b": 1e9, "bn": 1e9, "billion": 1e9}

# Every form of "not" is one cue; so are verbs that negate what follows (stop smoking = not smoke).
NEGATION_CUES: dict[str, str] = {
    **dict.fromkeys(
        _set(
            "not no cannot cant non ne pas nie kein keine nicht nunca nada sin jamais stop stops stopped "
            "stopping avoid avoids avoided avoiding prevent prevents preventing quit"
        ),
        "not",
    ),
    **{w: w for w in _set("never without none nobody nothing nowhere neither nor")},
}
NEGATING_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "mis", "ab", "de", "a")
# A comparison downwards said on one side only ("less healthy" beside "healthier").
ONE_SIDED_DOWNWARDS = _set("less least fewer fewest")

# Opposites of value or polarity (reported as "negation").
NEGATION_PAIRS = _pairs(
    "good / bad, poor; better / worse; best / worst; true / false; right / wrong; correct / wrong;"
    "safe / dangerous, harmful, risky; safer / riskier; healthy / harmful; easy / hard, difficult;"
    "easier / harder; polite / rude; legal / banned, forbidden; allowed / forbidden, banned, prohibited;"
    "allow / forbid, ban, prohibit; well / poorly, badly; love / hate; like / hate; loves / hates;"
    "pros / cons; advantages / drawbacks; benefits / harms, risks, drawbacks, dangers, downsides;"
    "rich / poor; richest / poorest; strong / weak; stronger / weaker; strongest / weakest;"
    "pass / fail; passed / failed; accept / reject, decline, refuse; accepting / rejecting, declining;"
    "grow / shrink; growing / shrinking; include / exclude, leave_out; open / close, shut;"
    "opening / closing; join / leave, quit; create / delete, remove; add / remove, delete;"
    "freeze / thaw, defrost; encrypt / decrypt; enable / disable; enabled / disabled;"
    "turn_on / turn_off; switch_on / switch_off; login / logout; signin / signout; signup / cancel;"
    "subscribe / cancel; success / failure; succeed / fail; win / lose; won / lost; winning / losing;"
    "profit / loss; gain / loss, lose; positive / negative; approve / reject; admit / deny;"
    "confirm / deny, cancel; begin / end; male / female; men / women; man / woman; boy / girl;"
    "boys / girls; husband / wife; father / mother; son / daughter; brother / sister; happy / sad;"
    "clean / dirty; wet / dry; full / empty; alive / dead; friend / enemy; guilty / innocent;"
    "teach / learn; attack / defend; lock / unlock; pay / owe; hire / fire; employer / employee;"
    "strength / weakness; strengths / weaknesses; approve / deny, refuse; approved / rejected, denied,"
    "refused, declined; accepted / rejected, refused, declined; good / terrible, awful, horrible;"
    "great / terrible, awful, horrible; make / lose; book / cancel; friends / enemies"
)
# Opposite directions, sizes, times and transfers (reported as "direction").
DIRECTION_PAIRS = _pairs(
    "up / down; upward / downward; rise / fall, drop, set; rises / falls; rising / falling;"
    "increase / decrease, reduce, lower, cut; increases / decreases; raise / lower, reduce, cut;"
    "higher / lower; highest / lowest; high / low; more / less, fewer; most / least, fewest;"
    "bigger / smaller; biggest / smallest; larger / smaller; largest / smallest; big / small, little;"
    "large / small; greater / less, smaller; taller / shorter; tallest / shortest; tall / short;"
    "longer / shorter; longest / shortest; long / short; older / younger, newer; oldest / youngest, newest;"
    "old / young, new; faster / slower; fastest / slowest; fast / slow; quicker / slower;"
    "heavier / lighter; heaviest / lightest; heavy / light; hotter / colder, cooler; hottest / coldest;"
    "hot / cold; warmer / colder, cooler; warmest / coldest; warm / cold, cool;"
    "cheaper / dearer, pricier, expensive; cheapest / dearest, expensive; cheap / expensive, dear, costly;"
    "early / late; earlier / later; earliest / latest; first / last; before / after; above / below;"
    "over / under; inside / outside; north / south; east / west; northern / southern; eastern / western;"
    "left / right; buy / sell; buying / selling; bought / sold; buyer / seller; import / export;"
    "imports / exports; importing / exporting; importer / exporter; upload / download;"
    "uploading / downloading; send / receive; sending / receiving; sent / received; lend / borrow;"
    "lending / borrowing; lender / borrower; deposit / withdraw; deposits / withdrawals; push / pull;"
    "enter / exit; entry / exit; input / output; inbound / outbound; incoming / outgoing; ahead / behind;"
    "forward / backward, back; front / back; top / bottom; maximum / minimum; max / min;"
    "add / subtract; plus / minus; multiply / divide; multiplied / divided; debit / credit;"
    "winner / loser; arrival / departure; arrivals / departures; arrive / depart, leave; inhale / exhale;"
    "sunrise / sunset; upstairs / downstairs; uphill / downhill; am / pm"
)
# Two words read as one, so that their opposites can be paired.
PHRASES = {
    "turn on": "turn_on", "turn off": "turn_off", "switch on": "switch_on", "switch off": "switch_off",
    "log in": "login", "log out": "logout", "sign in": "signin", "sign out": "signout",
    "sign up": "signup", "leave out": "leave_out",
}  # fmt: skip

UNITS = {
    "celsius": "°C", "centigrade": "°C", "°c": "°C", "c°": "°C", "c": "°C", "fahrenheit": "°F", "°f": "°F",
    "f": "°F", "kelvin": "K",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "mile": "mi", "miles": "mi", "mi": "mi", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "foot": "ft", "feet": "ft", "ft": "ft", "inch": "in", "inches": "in", "cm": "cm", "centimeter": "cm",
    "centimeters": "cm", "centimetre": "cm", "centimetres": "cm", "mm": "mm", "yard": "yd", "yards": "yd",
    "acre": "acre", "acres": "acre", "hectare": "ha", "hectares": "ha", "ha": "ha",
    "kg": "kg", "kilogram": "kg", "kilograms": "kg", "kilo": "kg", "kilos": "kg", "gram": "g", "grams": "g",
    "g": "g", "pound": "lb", "pounds": "lb", "lb": "lb", "lbs": "lb", "ounce": "oz", "ounces": "oz",
    "oz": "oz", "ton": "t", "tons": "t", "tonne": "t", "tonnes": "t",
    "liter": "l", "liters": "l", "litre": "l", "litres": "l", "l": "l", "gallon": "gal", "gallons": "gal",
    "ml": "ml", "cup": "cup", "cups": "cup", "teaspoon": "tsp", "teaspoons": "tsp", "tsp": "tsp",
    "tablespoon": "tbsp", "tablespoons": "tbsp", "tbsp": "tbsp",
    "seconds": "s", "minute": "min", "minutes": "min", "min": "min", "hour": "h", "hours": "h", "h": "h",
    "day": "d", "days": "d", "week": "wk", "weeks": "wk", "month": "mo", "months": "mo", "year": "yr",
    "years": "yr",
    "mph": "mph", "kph": "kph", "kmh": "kph", "knot": "kn", "knots": "kn", "byte": "B", "bytes": "B",
    "kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB", "mbps": "Mbps", "watt": "W", "watts": "W", "kw": "kW",
    "kwh": "kWh", "kva": "kVA", "volt": "V", "volts": "V",
    "percent": "%", "%": "%", "$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "€": "EUR",
    "eur": "EUR", "euro": "EUR", "euros": "EUR", "£": "GBP", "gbp": "GBP", "sterling": "GBP", "¥": "JPY",
    "yen": "JPY", "jpy": "JPY", "₦": "NGN", "naira": "NGN", "ngn": "NGN", "cedi": "GHS", "cedis": "GHS",
    "rand": "ZAR", "zar": "ZAR", "shilling": "KES", "shillings": "KES", "kes": "KES", "yuan": "CNY",
    "rupee": "INR", "rupees": "INR", "bitcoin": "BTC", "btc": "BTC",
}  # fmt: skip

DATE_WORDS = _set(
    "january february march april june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec "
    "monday tuesday wednesday thursday friday saturday sunday today tomorrow yesterday tonight "
    "morning afternoon evening night midnight noon weekend weekends weekday weekdays "
    "spring summer autumn winter daily weekly monthly yearly annually "
    "next last previous upcoming ago"
)
# Words of one kind that name different things (dog / cat, liver / kidney, malaria / typhoid): a word of a
# kind on one side only, beside another of the same kind on the other side only, asks about something else.
# Words on one line after "=" are one thing (maize = corn).
KINDS: dict[str, tuple[str, str]] = {}
for _kind, _words in {
    "animal": "dog cat goat sheep cow chicken hen horse pig donkey camel rabbit duck fish snake lion tiger "
    "elephant giraffe monkey rat mouse bird parrot bee ant mosquito cockroach puppy=dog kitten=cat",
    "body": "liver kidney heart lung brain stomach skin eye ear tooth=teeth bone blood hair nail throat neck "
    "knee",
    "disease": "malaria typhoid cholera dengue measles polio diabetes asthma hiv=aids tuberculosis=tb covid "
    "flu=influenza pneumonia hepatitis ebola cancer stroke ulcer lassa mpox chickenpox",
    "drug": "paracetamol=acetaminophen ibuprofen aspirin amoxicillin ciprofloxacin metformin insulin codeine",
    "food": "rice beans yam=yams cassava maize=corn wheat millet sorghum onion garlic tomato pepper potato "
    "plantain banana pineapple mango orange apple avocado pawpaw=papaya coconut okra egusi ogbono spinach "
    "cabbage carrot groundnut=peanut sesame cocoa coffee tea milk egg bread chapati mandazi ugali fufu amala "
    "eba garri suya",
    "material": "gold silver copper iron steel aluminium=aluminum plastic glass wood cotton wool silk "
    "leather",
    "substance": "water ethanol alcohol oil petrol=gasoline diesel kerosene",
    "wave": "sound light",
    "relative": "mother father son daughter brother sister aunt uncle grandmother grandfather wife husband",
    "colour": "red blue green yellow black white brown purple pink grey=gray",
    "vehicle": "car bus train plane=airplane=aircraft motorcycle=motorbike bicycle=bike boat ship taxi truck",
    "device": "phone=smartphone=cellphone laptop tablet tv=television printer router fridge=refrigerator "
    "computer desktop camera",
    "sport": "football=soccer basketball tennis cricket rugby chess checkers boxing volleyball golf",
    "subject": "maths=math=mathematics physics chemistry biology history geography economics",
    "instrument": "guitar piano drums violin flute saxophone",
    "job": "doctor nurse lawyer engineer teacher pilot accountant farmer pharmacist dentist",
    # Places and languages are names, but typed in lowercase they are not told apart as names are.
    "place": "nigeria ghana kenya uganda tanzania rwanda burundi ethiopia somalia sudan egypt libya "
    "tunisia algeria morocco senegal mali niger chad cameroon gabon congo angola zambia zimbabwe malawi "
    "mozambique namibia botswana lesotho eswatini madagascar mauritius benin togo liberia gambia guinea "
    "usa=america canada mexico brazil argentina uk=britain ireland france germany spain portugal italy "
    "netherlands belgium switzerland sweden norway denmark poland russia ukraine turkey israel "
    "india pakistan bangladesh china japan korea indonesia malaysia singapore philippines vietnam "
    "thailand australia dubai qatar lagos abuja ibadan kano kaduna enugu benin calabar jos accra kumasi "
    "tamale nairobi mombasa kisumu nakuru eldoret kampala entebbe kigali dodoma arusha zanzibar "
    "dakar bamako abidjan lome cotonou cairo alexandria casablanca tunis johannesburg durban pretoria "
    "soweto harare lusaka lilongwe luanda kinshasa london paris berlin madrid rome amsterdam brussels "
    "lisbon frankfurt manchester birmingham toronto chicago washington boston atlanta houston tokyo "
    "beijing shanghai mumbai delhi singapore sydney",
    "language": "english french spanish german portuguese italian arabic chinese mandarin japanese "
    "korean hindi russian dutch swahili kiswahili yoruba igbo hausa amharic zulu xhosa somali wolof "
    "twi lingala pidgin afrikaans",
    "planet": "mercury venus mars jupiter saturn uranus neptune pluto",
    # The action of a how-to question on the same object (cook / reheat porridge, write / read a CV); "make",
    # "get" and "keep" say too little to be told apart, and are left out.
    "operation": "install uninstall repair=fix clean build wash iron delete=remove=erase "
    "create=write=compose edit update=upgrade reset block unblock activate deactivate "
    "renew replace backup restore reboot=restart cook=prepare reheat=warm store plant=sow "
    "prune=trim harvest read respond=reply grade apply repay send=transfer sign fill amend "
    "host charge paint print scan share translate register=enroll=signup book=reserve "
    "cancel drive",
}.items():
    for _word in _words.split():
        _same = _word.split("=")
        for _w in _same:
            KINDS[_w] = (_kind, _same[0])

# Skipped when reading what follows "from" / "to" / "than" ("from my savings": savings).
DETERMINERS = _set("the a an my your our their his her its this that these those")

# A few languages' commonest words, to tell them apart (other scripts are told apart by script). Words that
# are English too (die, was, son, as, do) are left out of the others' lists.
LANGUAGE_WORDS = {
    "en": _set(
        "the is are what how why who which where when whom whose of and to in it for you do does did can "
        "i my me your a an with on at about from get give tell make should will would could might must "
        "this that there be been have has had was were not am any some all very so if or but as by up out "
        "just than then them they we he she his her its our their us him here into over under after "
        "before between during through also only even still too again ever every each other such own same "
        "many much"
    ),
    "fr": _set("le la les est sont quel quelle comment pourquoi qui des et pour vous une un du je au aux"),
    "es": _set("el los las qué cómo por quién y para usted una del cuál cuánto está mejor"),
    "de": _set("der das ist sind wie warum wer und für ein eine nicht mit ich"),
    "pt": _set("os é são que como quem e em para você uma um da faço"),
    "yo": _set("ni ti kò jẹ́ bí wo ṣe fún àti"),
    "sw": _set(
        "ni na ya wa kwa za katika je nini gani kuhusu jinsi vipi wapi lini nani sana tafadhali habari yako "
        "lako langu hii huu kama kwenye"
    ),
    "ha": _set("da ne ce yaya wane ina shin kuma akwai"),
    "ig": _set("kedu bụ ka gị ndị nke"),
}
FILLER = _set(
    "i a an the please can could would you tell me what whats what's is are was were do does how much many "
    "of for in on at by with about my your our it this that these those be to"
)
