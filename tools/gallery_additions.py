"""What the gallery's second pass (issue #33) adds to the bundled gallery, read by ``tools/build_gallery.py``.

Every photo in the gallery is at least ``MIN_SIDE`` px on its long side: a smaller one is dropped, or replaced
under the same name by a larger photo of the same subject from an offline source (``ADDITIONS`` entries whose
path already exists). The edits the demo page advertises need right answers, so the gallery also gets:

- real photos of the same kind of object in several colours (Saleor's hoodies, polo shirts and plimsolls, the
  paint tins, three flowers), marked with colour labels (``COLOUR_LABELS``);
- buildings by day and at night: real night photos from GCompris, and night versions of day photos made with
  the project's own tone edit (``DERIVED``, ``engine.data.tone.photo_edit(rgb, "night")``);
- colour and black and white: black-and-white versions made the same way (``photo_edit(rgb, "bw")``), and the
  grey-scale photos scikit-image ships (the photographer, the coins).

A derived image is labelled ``night`` or ``black and white``; its caption says in plain words that it is a darkened
or black-and-white version of another photo (``derived_caption``), and ``assets/ATTRIBUTION`` says which gallery photo
it was made from and by which function. Its base photo gets the label ``day`` or ``colour``.
"""
from __future__ import annotations

MIN_SIDE = 256

GC = "gcompris"
TUX = "tuxpaint"

# (gallery path, source, original (GCompris: the path under src/activities; Tux Paint: the path under the stamps
#  folder), caption, labels (category first))
ADDITIONS = [
    # --- animals: larger photos of the same subject under the old name, then new members of each kind
    ("animals/horse.jpg", GC, "explore_farm_animals/resource/animals/horse.webp", "a horse", ["animals", "mammal", "horse"]),
    ("animals/giraffe.jpg", GC, "erase/resource/giraffe.webp", "a giraffe", ["animals", "mammal", "giraffe"]),
    ("animals/gorilla.jpg", GC, "erase/resource/gorilla.webp", "a gorilla", ["animals", "mammal", "ape", "gorilla"]),
    ("animals/squirrel.jpg", GC, "erase/resource/squirrel.webp", "a squirrel", ["animals", "mammal", "squirrel"]),
    ("animals/camel.jpg", GC, "erase/resource/camels.webp", "camels", ["animals", "mammal", "camel"]),
    ("animals/pig-golden.jpg", TUX, "animals/mammals/pig_golden2.png", "a golden pig", ["animals", "mammal", "pig"]),
    ("animals/horse-2.jpg", GC, "erase/resource/horse.webp", "a horse", ["animals", "mammal", "horse"]),
    ("animals/pig.jpg", GC, "explore_farm_animals/resource/animals/pig.webp", "a pig", ["animals", "mammal", "pig"]),
    ("animals/alpaca.jpg", GC, "erase/resource/alpaca.webp", "an alpaca", ["animals", "mammal", "alpaca"]),
    ("animals/bee.jpg", GC, "erase/resource/bee.webp", "a bee", ["animals", "insect", "bee"]),
    ("animals/chameleon.jpg", GC, "erase/resource/chamaeleon.webp", "a chameleon", ["animals", "reptile", "chameleon"]),
    ("animals/chameleon-2.jpg", GC, "explore_world_animals/resource/animals/chameleon.webp", "a chameleon",
     ["animals", "reptile", "chameleon"]),
    ("animals/komodo-dragon.jpg", GC, "explore_world_animals/resource/animals/dragon.webp", "a komodo dragon",
     ["animals", "reptile", "komodo dragon"]),
    ("animals/lemur.jpg", GC, "explore_world_animals/resource/animals/lemur.webp", "ring-tailed lemurs",
     ["animals", "mammal", "lemur"]),
    ("animals/flying-fox.jpg", GC, "erase/resource/flying_fox.webp", "a flying fox (a fruit bat)",
     ["animals", "mammal", "bat"]),
    ("animals/gibbon.jpg", GC, "erase/resource/gibbon.webp", "a gibbon", ["animals", "mammal", "ape", "gibbon"]),
    ("animals/goat.jpg", GC, "erase/resource/goat.webp", "a goat", ["animals", "mammal", "goat"]),
    ("animals/gosling.jpg", GC, "erase/resource/gosling.webp", "a gosling", ["animals", "bird", "gosling"]),
    ("animals/heron.jpg", GC, "erase/resource/heron.webp", "a heron in flight", ["animals", "bird", "heron"]),
    ("animals/kingfisher.jpg", GC, "erase/resource/kingfisher.webp", "a kingfisher", ["animals", "bird", "kingfisher"]),
    ("animals/proboscis-monkey.jpg", GC, "erase/resource/long_nosed_monkey.webp", "a proboscis monkey",
     ["animals", "mammal", "monkey"]),
    ("animals/meerkat.jpg", GC, "erase/resource/meerkats.webp", "meerkats", ["animals", "mammal", "meerkat"]),
    ("animals/nubian-ibex.jpg", GC, "erase/resource/nubian_ibex.webp", "a Nubian ibex", ["animals", "mammal", "ibex"]),
    ("animals/pika.jpg", GC, "erase/resource/pika.webp", "a pika", ["animals", "mammal", "pika"]),
    ("animals/red-panda.jpg", GC, "erase/resource/red_panda.webp", "a red panda", ["animals", "mammal", "red panda"]),
    ("animals/swan.jpg", GC, "erase/resource/swans.webp", "swans on the water", ["animals", "bird", "swan"]),
    ("animals/toucan.jpg", GC, "erase/resource/toucan.webp", "a toucan", ["animals", "bird", "toucan"]),
    ("animals/guineafowl.jpg", TUX, "animals/birds/helmeted_guineafowl.png", "a helmeted guineafowl",
     ["animals", "bird", "guineafowl"]),
    ("animals/peacock.jpg", TUX, "animals/birds/peacock.png", "a peacock", ["animals", "bird", "peacock"]),
    ("animals/pink-flamingo.jpg", TUX, "animals/birds/pink_flamingo.png", "a pink flamingo",
     ["animals", "bird", "flamingo"]),
    ("animals/magellanic-penguin.jpg", TUX, "animals/birds/magellanic_penguin.png", "a Magellanic penguin",
     ["animals", "bird", "penguin"]),
    ("animals/capybara.jpg", TUX, "animals/mammals/rodents/capybara.png", "a capybara", ["animals", "mammal", "capybara"]),
    ("animals/otter.jpg", TUX, "animals/mammals/aquatic/otter.png", "an otter", ["animals", "mammal", "otter"]),
    ("animals/brown-bear.jpg", TUX, "animals/mammals/bears/european-bear.png", "a European brown bear",
     ["animals", "mammal", "bear"]),
    ("animals/chimpanzee.jpg", TUX, "animals/mammals/apes/chimp.png", "a chimpanzee", ["animals", "mammal", "ape"]),
    ("animals/mantis.jpg", TUX, "animals/insects/mantis.png", "a praying mantis", ["animals", "insect", "mantis"]),
    *[(f"animals/fish-{16 + i}.jpg", GC, f"categorization/resource/images/fishes/fish{n}.webp", "a fish",
       ["animals", "fish"]) for i, n in enumerate((10, 11, 14, 15, 16, 18, 20, 21, 22, 25, 3, 4, 8))],
    # --- buildings: real night photos, then more landmarks by day
    ("buildings/notre-dame-at-night.jpg", GC, "details/resource/image/NDP_background.webp",
     "the cathedral of Notre-Dame de Paris at night", ["buildings", "landmark", "cathedral", "night"]),
    ("buildings/tower-bridge-at-night.jpg", GC, "details/resource/image/TowerBridgeLondon_background.webp",
     "Tower Bridge in London at night", ["buildings", "landmark", "bridge", "night"]),
    ("buildings/louvre-at-night.jpg", GC, "details/resource/image/Louvre_2007_02_24_c_background.webp",
     "the Louvre pyramid in Paris at night", ["buildings", "landmark", "louvre", "night"]),
    ("buildings/winter-palace-at-night.jpg", GC, "categorization/resource/images/monuments/zimniPalace.webp",
     "the Winter Palace in Saint Petersburg lit up at night", ["buildings", "monument", "winter palace", "night"]),
    ("buildings/eiffel-tower.jpg", GC, "explore_monuments/resource/france/eiffelTower.webp", "the Eiffel Tower",
     ["buildings", "monument", "eiffel tower", "france", "day"]),
    ("buildings/taj-mahal.jpg", GC, "explore_monuments/resource/wonders/tajMahal.webp", "the Taj Mahal",
     ["buildings", "monument", "taj mahal", "day"]),
    ("buildings/chenonceau.jpg", GC, "details/resource/image/Chenonceau_background.webp",
     "the Chateau de Chenonceau over the river", ["buildings", "landmark", "castle", "day"]),
    ("buildings/eilean-donan-castle.jpg", GC, "details/resource/image/EilanDonanCastle_background.webp",
     "Eilean Donan castle in Scotland", ["buildings", "landmark", "castle", "day"]),
    ("buildings/christ-the-redeemer.jpg", GC, "explore_monuments/resource/wonders/christTheRedeemer.webp",
     "Christ the Redeemer above Rio de Janeiro", ["buildings", "monument", "christ the redeemer"]),
    ("buildings/empire-state-building.jpg", GC, "categorization/resource/images/monuments/empireState.webp",
     "the Empire State Building", ["buildings", "monument", "skyscraper", "day"]),
    ("buildings/great-wall.jpg", GC, "explore_monuments/resource/wonders/greatWallofChina.webp",
     "the Great Wall of China", ["buildings", "monument", "great wall"]),
    ("buildings/qutub-minar.jpg", GC, "explore_monuments/resource/india/qutubMinar.webp", "the Qutub Minar",
     ["buildings", "monument", "qutub minar", "india"]),
    ("buildings/leaning-tower-of-pisa.jpg", GC, "categorization/resource/images/monuments/leaningTowerOfPisa.webp",
     "the Leaning Tower of Pisa", ["buildings", "monument", "leaning tower of pisa", "day"]),
    ("buildings/mount-rushmore.jpg", GC, "explore_monuments/resource/usa/mountRushmore.webp", "Mount Rushmore",
     ["buildings", "monument", "mount rushmore", "usa"]),
    ("buildings/statue-of-liberty.jpg", GC, "explore_monuments/resource/usa/statueofLiberty.webp",
     "the Statue of Liberty", ["buildings", "monument", "statue of liberty", "usa", "day"]),
    ("buildings/india-gate.jpg", GC, "categorization/resource/images/monuments/IndiaGate.webp", "India Gate in Delhi",
     ["buildings", "monument", "india gate", "india", "day"]),
    ("buildings/mont-saint-michel.jpg", GC, "explore_monuments/resource/france/montStMichel.webp",
     "Mont Saint-Michel", ["buildings", "monument", "mont saint-michel", "france"]),
    ("buildings/palais-des-papes.jpg", GC, "explore_monuments/resource/france/palaisdesPapes.webp",
     "the Palais des Papes in Avignon", ["buildings", "monument", "palace", "france"]),
    ("buildings/pont-du-gard.jpg", GC, "explore_monuments/resource/france/pontduGard.webp", "the Pont du Gard",
     ["buildings", "monument", "bridge", "france"]),
    ("buildings/berlin-cathedral.jpg", GC, "explore_monuments/resource/germany/berlinCathedral.webp",
     "Berlin Cathedral", ["buildings", "monument", "cathedral", "germany", "day"]),
    ("buildings/golden-temple.jpg", GC, "explore_monuments/resource/india/goldenTemple.webp", "the Golden Temple",
     ["buildings", "monument", "temple", "india"]),
    ("buildings/mysore-palace.jpg", GC, "explore_monuments/resource/india/mysorePalace.webp", "Mysore Palace",
     ["buildings", "monument", "palace", "india"]),
    ("buildings/machu-picchu.jpg", GC, "explore_monuments/resource/wonders/machuPicchu.webp", "Machu Picchu",
     ["buildings", "monument", "machu picchu"]),
    ("buildings/petra.jpg", GC, "explore_monuments/resource/wonders/petra.webp", "Petra", ["buildings", "monument", "petra"]),
    ("buildings/arles-amphitheatre.jpg", GC, "explore_monuments/resource/france/arlesAmphitheater.webp",
     "the Roman amphitheatre of Arles", ["buildings", "monument", "amphitheatre", "france"]),
    ("buildings/inukshuk.jpg", TUX, "town/monuments/inukshuk-photo.png", "an inukshuk, a stone landmark",
     ["buildings", "monument", "inukshuk"]),
    # --- plants, food
    ("plants/birch.jpg", TUX, "plants/trees/birch.png", "a birch tree", ["plants", "tree", "birch"]),
    ("plants/palm-tree.jpg", TUX, "plants/trees/liberia-palm.png", "a palm tree", ["plants", "tree", "palm"]),
    ("plants/thyme.jpg", TUX, "plants/thyme.png", "a thyme plant in flower", ["plants", "thyme"]),
    ("food/apricot.jpg", TUX, "food/fruit/Apricot_whole.png", "an apricot", ["food", "fruit", "apricot", "orange"]),
    ("food/ginger.jpg", TUX, "food/spices/ginger.png", "a ginger root", ["food", "spice", "ginger"]),
    # --- tools, household, sports
    ("tools/hammer-6.jpg", GC, "categorization/resource/images/tools/hammer6.webp", "a hammer", ["tools", "hammer"]),
    ("tools/hammer-7.jpg", GC, "categorization/resource/images/tools/hammer2.webp", "a hammer", ["tools", "hammer"]),
    ("tools/hammer-8.jpg", GC, "categorization/resource/images/tools/hammer3.webp", "a sledgehammer", ["tools", "hammer"]),
    ("tools/hammer-9.jpg", GC, "categorization/resource/images/tools/hammer7.webp", "a hammer", ["tools", "hammer"]),
    ("tools/measuring-tape-4.jpg", GC, "categorization/resource/images/tools/measuringTape3.webp", "a measuring tape",
     ["tools", "measuring tape"]),
    ("tools/measuring-tape-5.jpg", GC, "categorization/resource/images/tools/measuringTape5.webp", "a measuring tape",
     ["tools", "measuring tape"]),
    ("tools/measuring-tape-6.jpg", GC, "categorization/resource/images/tools/measuringTape6.webp", "a measuring tape",
     ["tools", "measuring tape"]),
    ("tools/multimeter-3.jpg", GC, "categorization/resource/images/tools/multimeter1.webp", "a multimeter",
     ["tools", "multimeter"]),
    ("tools/plier-3.jpg", GC, "categorization/resource/images/tools/plier1.webp", "pliers", ["tools", "plier"]),
    ("tools/plier-4.jpg", GC, "categorization/resource/images/tools/plier3.webp", "pliers", ["tools", "plier"]),
    ("tools/scissors-3.jpg", GC, "categorization/resource/images/tools/scissors2.webp", "scissors", ["tools", "scissors"]),
    ("tools/scissors-4.jpg", GC, "categorization/resource/images/tools/scissors3.webp", "scissors", ["tools", "scissors"]),
    ("tools/screw-driver-3.jpg", GC, "categorization/resource/images/tools/screwDriver.webp", "a screwdriver",
     ["tools", "screw driver"]),
    ("tools/screw-driver-4.jpg", GC, "categorization/resource/images/tools/screwDriver2.webp", "a screwdriver",
     ["tools", "screw driver"]),
    ("tools/sickle.jpg", GC, "categorization/resource/images/tools/sickle.webp", "a sickle", ["tools", "sickle"]),
    ("tools/side-cutter.jpg", GC, "categorization/resource/images/tools/sideCutter1.webp", "side cutters",
     ["tools", "plier"]),
    ("tools/spray-bottle.jpg", GC, "categorization/resource/images/tools/spray.webp", "a red spray bottle",
     ["tools", "spray bottle", "red"]),
    ("tools/tweezers.jpg", GC, "categorization/resource/images/tools/tweezer.webp", "tweezers", ["tools", "tweezers"]),
    ("tools/wrench-2.jpg", GC, "categorization/resource/images/tools/wrench1.webp", "an adjustable wrench",
     ["tools", "wrench"]),
    ("tools/cement-mixer.jpg", TUX, "household/tools/cementmixer.png", "a cement mixer", ["tools", "cement mixer"]),
    ("household/chair.jpg", GC, "categorization/resource/images/others/chair.webp", "a white chair",
     ["household", "chair", "white"]),
    ("household/cup.jpg", GC, "categorization/resource/images/others/cup.webp", "a cup and saucer", ["household", "cup"]),
    ("household/tea-set.jpg", GC, "categorization/resource/images/others/buffetset.webp", "a cup and saucer",
     ["household", "cup"]),
    ("household/erasers.jpg", GC, "categorization/resource/images/others/erasers.webp", "an eraser",
     ["household", "eraser"]),
    ("household/cutlery.jpg", GC, "categorization/resource/images/others/knife.webp", "a knife, a fork and a spoon",
     ["household", "cutlery"]),
    ("household/plate.jpg", GC, "categorization/resource/images/others/plate.webp", "a white plate",
     ["household", "plate", "white"]),
    ("household/weighing-scale.jpg", GC, "categorization/resource/images/others/weighingMachine.webp",
     "a weighing scale", ["household", "weighing scale"]),
    ("household/thermometer.jpg", TUX, "medical/mercurythermometer.png", "a mercury thermometer",
     ["household", "thermometer"]),
    ("sports/volleyball.jpg", GC, "categorization/resource/images/others/volleyball.webp", "a volleyball",
     ["sports", "ball", "volleyball"]),
    # --- music, energy, space, people, vehicles
    ("music/music-africa.jpg", GC, "explore_world_music/resource/music/africa.webp", "African drums",
     ["music", "instrument", "drum"]),
    ("music/music-america.jpg", GC, "explore_world_music/resource/music/america.webp",
     "a drum kit and electric guitar", ["music", "musicians"]),
    ("music/music-ireland.jpg", GC, "explore_world_music/resource/music/ireland.webp", "Irish folk musicians playing",
     ["music", "musicians"]),
    ("music/music-orchestra.jpg", GC, "explore_world_music/resource/music/orchestra.webp", "a symphony orchestra",
     ["music", "musicians"]),
    ("music/guitar-electric.jpg", TUX, "hobbies/music/string/guitar_electric.png", "an electric guitar",
     ["music", "string instrument", "guitar", "black"]),
    ("energy/dam-5.jpg", GC, "categorization/resource/images/renewable/dam5.webp", "a hydroelectric dam",
     ["energy", "dam"]),
    *[(f"energy/solar-panel-{4 + i}.jpg", GC, f"categorization/resource/images/renewable/solar{n}.webp",
       "solar panels", ["energy", "solar panel"]) for i, n in enumerate((2, 3, 4, 5, 8))],
    ("energy/wind-turbine-7.jpg", GC, "categorization/resource/images/renewable/windmill6.webp", "a wind turbine",
     ["energy", "wind turbine"]),
    *[(f"energy/windmill{'' if i == 0 else f'-{i + 1}'}.jpg", GC,
       f"categorization/resource/images/renewable/windmill{n}.webp", "a traditional windmill", ["energy", "windmill"])
      for i, n in enumerate(("", 11, 12, 13, 2, 3))],
    ("space/mars.jpg", GC, "solar_system/resource/mars.webp", "the planet Mars", ["space", "planet", "mars"]),
    ("space/saturn.jpg", GC, "solar_system/resource/saturn.webp", "the planet Saturn", ["space", "planet", "saturn"]),
    ("space/jupiter.jpg", GC, "solar_system/resource/jupiter.webp", "the planet Jupiter", ["space", "planet", "jupiter"]),
    ("space/uranus.jpg", GC, "solar_system/resource/uranus.webp", "the planet Uranus", ["space", "planet", "uranus"]),
    ("space/sun.jpg", GC, "solar_system/resource/sun.webp", "the Sun", ["space", "star", "sun"]),
    ("people/the-palm-of-a-right-hand.jpg", GC, "leftright/resource/main_droite_paume_0.webp",
     "the palm of a right hand", ["people", "hand"]),
    ("people/the-back-of-a-left-hand.jpg", GC, "leftright/resource/main_gauche_dessus_0.webp",
     "the back of a left hand", ["people", "hand"]),
]

# (new gallery path, base gallery path, photo_edit kind); the base must be in the gallery when it is made.
DERIVED = [
    *[(f"buildings/{stem}-at-night.jpg", f"buildings/{stem}.jpg", "night") for stem in (
        "toureiffel", "colosseum", "operasidney", "taj-mahal", "neuschwanstein", "parthenon", "us-capitol",
        "arc-de-triomphe", "chinese-temple", "statue-of-liberty", "brandenburg-gate", "empire-state-building")],
    *[(f"buildings/{stem}-black-and-white.jpg", f"buildings/{stem}.jpg", "bw") for stem in (
        "eiffel-tower", "colosseum", "taj-mahal", "leaning-tower-of-pisa", "berlin-cathedral", "india-gate",
        "chenonceau", "eilean-donan-castle", "parthenon", "us-capitol", "arc-de-triomphe", "statue-of-liberty")],
    *[(f"{stem}-black-and-white.jpg", f"{stem}.jpg", "bw") for stem in (
        "animals/dog-2", "animals/horse", "animals/giraffe", "animals/toucan", "vehicles/firetruck",
        "vehicles/indycar", "plants/anemone-red", "animals/red-panda")],
]
EDIT_WORDS = {"night": ("at night", "night", "day"), "bw": ("in black and white", "black and white", "colour")}
# what a derived photo's caption says about how it was made, in a visitor's words; the file and the function that
# made it are in assets/ATTRIBUTION, not in the caption the page shows
DERIVED_NOTES = {"night": "a darkened version of the daytime photo", "bw": "made from the colour photo"}


def derived_caption(base_caption: str, kind: str) -> str:
    """The caption of the ``kind`` edit of a photo captioned ``base_caption``: "the Colosseum at night (a darkened
    version of the daytime photo)"."""
    return f"{base_caption} {EDIT_WORDS[kind][0]} ({DERIVED_NOTES[kind]})"

# colour names of the photos whose object has one clear colour, and "<colour> <thing>" for the colour variants
COLOUR_LABELS = {
    "products/black-hoodie.jpg": ["black", "black hoodie"],
    "products/blue-hoodie.jpg": ["blue", "blue hoodie"],
    "products/mustard-hoodie.jpg": ["yellow", "orange", "mustard hoodie"],
    "products/white-hoodie.jpg": ["white", "white hoodie"],
    "products/white-hoodie-2.jpg": ["white", "white hoodie"],
    "products/polo-shirt.jpg": ["black", "black polo shirt"],
    "products/polo-shirt-4.jpg": ["black", "black polo shirt"],
    "products/polo-shirt-2.jpg": ["white", "white polo shirt"],
    "products/polo-shirt-3.jpg": ["white", "white polo shirt"],
    "products/code-division-t-shirt.jpg": ["black", "black t-shirt"],
    "products/code-division-t-shirt-2.jpg": ["black", "black t-shirt"],
    "products/t-shirt-2.jpg": ["turquoise", "turquoise t-shirt"],
    "products/white-plimsolls.jpg": ["white", "white shoes"],
    "products/white-plimsolls-2.jpg": ["white", "white shoes"],
    "products/white-plimsolls-3.jpg": ["white", "white shoes"],
    "products/white-plimsolls-4.jpg": ["white", "white shoes"],
    "products/yellow-plimsolls.jpg": ["yellow", "yellow shoes"],
    "products/yellow-plimsolls-2.jpg": ["yellow", "yellow shoes"],
    "products/yellow-plimsolls-3.jpg": ["yellow", "yellow shoes"],
    "products/red-dwarf-red-paint.jpg": ["red", "red paint"],
    "products/hyperspace-turquoise-paint.jpg": ["turquoise", "turquoise paint"],
    "products/white-parrot-cushion.jpg": ["white", "white cushion"],
    "plants/anemone-red.jpg": ["red", "red flower"],
    "plants/daffodil.jpg": ["yellow", "yellow flower"],
    "plants/pink-flower.jpg": ["pink", "pink flower"],
    "vehicles/firetruck.jpg": ["red"],
    "vehicles/green-korean-bus.jpg": ["green"],
}
# kinds that the first pass did not label (so that "a castle instead" has its answers in the labels)
KIND_LABELS = {rel: ["castle"] for rel in (
    "buildings/neuschwanstein.jpg", "buildings/neuschwanstein-castle.jpg", "buildings/chateaude-chambord.jpg",
    "buildings/nagoya.jpg", "buildings/egeskovslotspejling.jpg", "buildings/citede-carcassonne.jpg",
    "buildings/castillode-san-marcos.jpg", "buildings/castle-clinton.jpg")}
# grey-scale photos that are real black and white photos, not derived
REAL_BLACK_AND_WHITE = ("people/photographer.jpg", "household/coins.jpg")
