"""The figures: distinct colours where a legend must tell things apart."""


def test_every_feature_style_gets_its_own_colour():
    from fedshift.reporting.plots import style_colours

    names = ["clean", *[f"s{i}" for i in range(25)]]
    colours = style_colours(names)
    assert colours[0] == (1.0, 1.0, 1.0, 1.0)
    assert len(set(colours)) == len(names)
