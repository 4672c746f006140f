# Django's Bengali formats, plus the Indian digit grouping (১,২৩,৪৫৬) that Bengali readers write and
# that the browser's Intl.NumberFormat("bn") uses on the live pages (static/js/times.js).
from django.conf.locale.bn.formats import *  # noqa: F403

NUMBER_GROUPING = (3, 2, 0)
