"""The seed text the lab model's n-gram tables are counted from (original prose, written for the lab).

Plain ASCII English on purpose: greedy continuations read as text, so a degenerate output (one
repeated character) is easy to tell from a healthy one.
"""

SEED_TEXT = """\
The lighthouse stood at the end of a long stone pier, and every evening the keeper climbed the \
narrow stairs to light the lamp. From the gallery she could see the harbour, the fishing boats \
coming home, and the dark line of the hills behind the town. She kept a logbook of the weather, \
the ships that passed, and the birds that rested on the rail. In winter the storms came from the \
west, and the waves broke over the pier so high that the salt reached the windows of the lantern \
room. On calm nights she read by the light of a small oil lamp and listened to the sea.

The bakery on the corner opened before sunrise. The baker mixed flour, water, salt and yeast in \
a wide wooden trough, folded the dough by hand, and let it rest while the oven warmed. By six \
o'clock the first loaves were on the shelves, and the smell of fresh bread drifted down the \
street. Children on their way to school pressed their faces to the glass. The baker knew every \
customer by name and remembered who liked a dark crust and who wanted the bread sliced thin.

A river runs through the valley from the mountains to the sea. In spring it is fast and cold, \
full of melted snow, and it carries stones and branches down from the high meadows. In summer it \
slows, and the water turns clear enough to count the fish resting in the shade of the bridge. \
Farmers along the banks use the river to water their fields, and the mill at the bend still \
turns its wheel, although it no longer grinds any grain. In autumn the leaves float on the \
surface like small boats, gold and red, drifting toward the town.

The old library has a reading room with tall windows and long oak tables. Students come to study \
in the quiet afternoon light, and the librarian walks between the shelves with a cart of \
returned books. There are maps of distant islands, letters written by travellers, and a shelf \
of notebooks in which a gardener recorded the weather for forty years. Visitors often ask for \
the book about the stars, and the librarian brings it from a locked cabinet and opens it \
carefully on a cloth.

A good engineer measures before changing anything. She writes down what she expects, runs the \
test, and compares the result with the expectation. When the numbers agree, she moves on; when \
they do not, she looks for the reason before trying again. A careful rollout starts with one \
machine, watches it closely, and only then continues to the rest of the fleet. If a change makes \
things worse, it is rolled back at once, and the logs are kept so that the team can learn what \
went wrong.

In the garden behind the house there is an apple tree, a row of beans, and a bench painted \
green. The gardener works in the early morning, when the soil is still cool. She pulls the weeds \
between the rows, ties the tomato plants to their stakes, and fills a basket with whatever is \
ripe. In the evening the neighbours stop by the fence to talk about the rain, the price of \
seeds, and the new family that moved into the house by the station.

The train leaves the city at noon and reaches the coast in the late afternoon. It passes \
through farmland, small villages with church towers, and a forest where deer sometimes stand \
beside the track. Passengers read, sleep, or watch the fields go by. At the last station the air \
smells of salt and seaweed, and the platform is only a short walk from the beach, where the \
lighthouse can be seen at the end of the pier.
"""
