/*
 * Nesting depth of a jansson tree (a scalar is 0), shared by the scanner's
 * reference test and its fuzz target: both judge "too deep" the same way.
 */

#ifndef _JSON_DEPTH_H_INCLUDED_
#define _JSON_DEPTH_H_INCLUDED_


#include <jansson.h>


static int
json_depth(json_t *v)
{
    int          d, max;
    size_t       i;
    json_t      *e;
    const char  *key;

    max = 0;

    if (json_is_array(v)) {
        json_array_foreach(v, i, e) {
            d = json_depth(e);
            max = (d > max) ? d : max;
        }

        return max + 1;
    }

    if (json_is_object(v)) {
        json_object_foreach(v, key, e) {
            d = json_depth(e);
            max = (d > max) ? d : max;
        }

        return max + 1;
    }

    return 0;
}


#endif /* _JSON_DEPTH_H_INCLUDED_ */
